package bench

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// BenchmarkTimeBudgets measures a plan's time limits on PostgreSQL (issue
// 46), one part after the other; run it with -benchtime 1x:
//
//   - connection-time: on a pool of 12, a tenant with a cap of 10 and a
//     budget of 2 connection-seconds per second (burst 2 s) and a tenant
//     with a cap of 10 and no budget each run 1 s queries from 10 workers
//     for TENANTDB_BUDGET_RUN (default 60 s; calls admitted in it run to
//     their end); then the same without the budget. It reports each
//     tenant's connection-time held: the budget's, against Rate × run +
//     Burst, and what the other tenant gets of the capacity given up.
//   - statement timeout: pg_sleep(3600) under a 200 ms StatementTimeout,
//     five times: the call's time over 200 ms, against a round trip, and
//     whether the slot is back when it returns.
//   - idle transaction: a transaction left idle under a 500 ms
//     IdleInTransactionTimeout, five times: when its slot came back, after
//     its last statement, and whether the server session survived.
func BenchmarkTimeBudgets(b *testing.B) {
	run := 60 * time.Second
	if s := os.Getenv("TENANTDB_BUDGET_RUN"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatal(err)
		}
		run = d
	}
	for b.Loop() {
		budget := pool.Budget{Rate: 2, Burst: 2 * time.Second}
		if run > 0 { // TENANTDB_BUDGET_RUN=0: the time limits only
			with := connectionTime(b, run, budget)
			without := connectionTime(b, run, pool.Budget{})
			want := time.Duration(budget.Rate*float64(run)) + budget.Burst
			b.Logf("connection-time in %v (pool of 12, caps of 10, 1 s queries from 10 workers each):", run)
			b.Logf("  budget %v conn-s/s, burst %v: metered %.1f s (%d calls, want %.0f s ± 10%%), neighbour %.1f s (%d calls)",
				budget.Rate, budget.Burst, with.metered.Seconds(), with.meteredCalls, want.Seconds(), with.neighbour.Seconds(), with.neighbourCalls)
			b.Logf("  no budget: metered %.1f s (%d calls), neighbour %.1f s (%d calls)",
				without.metered.Seconds(), without.meteredCalls, without.neighbour.Seconds(), without.neighbourCalls)
			b.ReportMetric(with.metered.Seconds(), "budget-held-s")
			b.ReportMetric(with.metered.Seconds()/want.Seconds(), "budget-held/want")
			b.ReportMetric(with.neighbour.Seconds(), "neighbour-held-s")
			b.ReportMetric(without.neighbour.Seconds(), "neighbour-held-nobudget-s")
			b.ReportMetric(without.metered.Seconds(), "metered-held-nobudget-s")
		}

		runaway, sleep, rtt, slotBack := statementTimeoutRuns(b)
		b.Logf("pg_sleep(3600) under a 200 ms StatementTimeout: returned after %v (median of 5, max %v); "+
			"pg_sleep(0.2) without one, the reference: %v (median of 5, max %v); round trip %v; slot back at return: %v",
			median(runaway), slices.Max(runaway), median(sleep), slices.Max(sleep), rtt, slotBack)
		b.ReportMetric(float64(median(runaway)-200*time.Millisecond)/float64(time.Millisecond), "runaway-over-200ms-ms")
		b.ReportMetric(float64(median(sleep)-200*time.Millisecond)/float64(time.Millisecond), "sleep0.2-over-200ms-ms")
		b.ReportMetric(float64(rtt)/float64(time.Millisecond), "round-trip-ms")

		ended, late, alive := idleTransactionRuns(b)
		b.Logf("a transaction idle under a 500 ms IdleInTransactionTimeout: ended %v after its last statement (median of 5, max %v); "+
			"a 500 ms time.Sleep beside it, the reference: %v (median of 5, max %v); server session kept: %v",
			median(ended), slices.Max(ended), median(late), slices.Max(late), alive)
		b.ReportMetric(float64(slices.Max(ended))/float64(500*time.Millisecond), "idle-end/timeout-max")
		b.ReportMetric(float64(median(ended))/float64(500*time.Millisecond), "idle-end/timeout-median")
		b.ReportMetric(float64(slices.Max(late))/float64(500*time.Millisecond), "sleep/500ms-max")
	}
}

type heldTimes struct {
	metered, neighbour           time.Duration
	meteredCalls, neighbourCalls uint64
}

// connectionTime runs the connection-time part with the metered tenant's
// plan under budget (none when its Rate is 0).
func connectionTime(b *testing.B, run time.Duration, budget pool.Budget) heldTimes {
	cfg := pgxConfig(b)
	cfg.MaxConns, cfg.MinConns = 12, 12
	p, err := tenantdb.New(context.Background(), cfg, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{
			"metered": {MaxConns: 10, MaxWaiting: 10, Budget: budget},
			"capped":  {MaxConns: 10, MaxWaiting: 10},
		},
		DefaultPlan: "capped",
		Lookup: func(_ context.Context, id string) (tenantdb.Tenant, error) {
			if id == "metered" {
				return tenantdb.Tenant{Plan: "metered"}, nil
			}
			return tenantdb.Tenant{}, nil
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	end := time.Now().Add(run)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for _, tenant := range []string{"metered", "neighbour"} {
		for range 10 {
			wg.Go(func() {
				ctx := tenantdb.WithTenant(context.Background(), tenant)
				for {
					admit, cancel := context.WithDeadline(ctx, end)
					c, err := p.Acquire(admit)
					cancel()
					if err != nil {
						if !errors.Is(err, context.DeadlineExceeded) {
							errs <- err
						}
						return
					}
					_, err = c.Exec(ctx, "select pg_sleep(1)")
					c.Release()
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	m, n := p.TenantStat("metered"), p.TenantStat("neighbour")
	return heldTimes{m.HoldTime, n.HoldTime, m.Acquired, n.Acquired}
}

// statementTimeoutRuns times five runaway statements under a 200 ms
// StatementTimeout and, in turn with them, five pg_sleep(0.2) of a tenant
// without one: the server's own lateness to wake, the reference; and the
// median round trip of select 1.
func statementTimeoutRuns(b *testing.B) (runaway, sleep []time.Duration, rtt time.Duration, slotBack bool) {
	cfg := pgxConfig(b)
	cfg.MaxConns, cfg.MinConns = 2, 2
	p, err := tenantdb.New(context.Background(), cfg, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{
			"free": {MaxConns: 1, StatementTimeout: 200 * time.Millisecond},
			"paid": {MaxConns: 1},
		},
		DefaultPlan: "free",
		Lookup: func(_ context.Context, id string) (tenantdb.Tenant, error) {
			if id == "ref" {
				return tenantdb.Tenant{Plan: "paid"}, nil
			}
			return tenantdb.Tenant{}, nil
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := tenantdb.WithTenant(context.Background(), "a")
	var trips []time.Duration
	for range 21 {
		began := time.Now()
		if _, err := p.Exec(ctx, "select 1"); err != nil {
			b.Fatal(err)
		}
		trips = append(trips, time.Since(began))
	}
	ref := tenantdb.WithTenant(context.Background(), "ref")
	slotBack = true
	for range 5 {
		began := time.Now()
		_, err := p.Exec(ctx, "select pg_sleep(3600)")
		runaway = append(runaway, time.Since(began))
		if !errors.Is(err, tenantdb.ErrStatementTimeout) {
			b.Fatalf("pg_sleep(3600): %v, want ErrStatementTimeout", err)
		}
		slotBack = slotBack && p.TenantStat("a").InUse == 0
		began = time.Now()
		if _, err := p.Exec(ref, "select pg_sleep(0.2)"); err != nil {
			b.Fatal(err)
		}
		sleep = append(sleep, time.Since(began))
	}
	return runaway, sleep, median(trips), slotBack
}

// idleTransactionRuns leaves five transactions idle under a 500 ms
// IdleInTransactionTimeout and times when each one's slot came back, after
// its last statement, and in turn with them a 500 ms time.Sleep, the
// machine's own lateness to wake, the reference; alive is whether every
// ended transaction's server session stayed (its backend still in
// pg_stat_activity, no connection opened beside it).
func idleTransactionRuns(b *testing.B) (ended, late []time.Duration, alive bool) {
	cfg := pgxConfig(b)
	cfg.MaxConns, cfg.MinConns = 1, 1
	p, err := tenantdb.New(context.Background(), cfg, tenantdb.Config{
		Plans:  map[string]tenantdb.Plan{"free": {MaxConns: 1, IdleInTransactionTimeout: 500 * time.Millisecond}},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	raw, err := pgxpool.NewWithConfig(context.Background(), pgxConfig(b))
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	ctx := tenantdb.WithTenant(context.Background(), "a")
	alive = true
	for range 5 {
		tx, err := p.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		var pid uint32
		if err := tx.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
			b.Fatal(err)
		}
		last := time.Now()
		for p.TenantStat("a").InUse != 0 {
			time.Sleep(time.Millisecond) // a probe of the slot, every millisecond
		}
		ended = append(ended, time.Since(last))
		if err := tx.Commit(ctx); !errors.Is(err, tenantdb.ErrIdleInTransaction) {
			b.Fatalf("commit after the end: %v, want ErrIdleInTransaction", err)
		}
		var n int
		if err := raw.QueryRow(context.Background(), "select count(*) from pg_stat_activity where pid = $1", pid).Scan(&n); err != nil {
			b.Fatal(err)
		}
		alive = alive && n == 1
		began := time.Now()
		time.Sleep(500 * time.Millisecond)
		late = append(late, time.Since(began))
	}
	alive = alive && p.Pgxpool().Stat().NewConnsCount() == 1
	return ended, late, alive
}
