package bench

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// The database-per-tenant workload: one hot tenant in its database keeps
// hotWorkers statements going, while coldCalls calls walk through the other
// benchDatabases-1 databases, coldWorkers at a time, each to a database not
// used for a while.
const (
	benchDatabases = 40
	dbBudget       = 8
	hotWorkers     = 4
	coldWorkers    = 2
	coldCalls      = 120
	perDBMaxConns  = 4 // the pool-per-database approach: each database's own pgxpool
)

// BenchmarkDatabasePerTenant runs the workload on tenantdb with
// Config.Database and a budget of dbBudget connections, and on a pgxpool per
// database (MaxConns perDBMaxConns each, no budget), and reports for each:
// the hot and cold calls' p50 and p99, the connections opened per cold
// call (the churn), the mean time of an open, the hot database's opens
// beyond its first hotWorkers (zero when it keeps its warm connections) and
// the most connections the server counted.
func BenchmarkDatabasePerTenant(b *testing.B) {
	ctx := context.Background()
	createBenchDatabases(b)
	template, err := pgxpool.ParseConfig(postgres(b).DSN)
	if err != nil {
		b.Fatal(err)
	}
	template.MaxConns, template.MinConns = dbBudget, 0
	template.ConnConfig.RuntimeParams["application_name"] = "bench-dbper"
	dbOf := func(tenant string) (string, error) { return "bench_" + tenant, nil }

	for b.Loop() {
		// tenantdb, one budget.
		p, err := tenantdb.New(ctx, template.Copy(), tenantdb.Config{
			Plans:    map[string]tenantdb.Plan{"p": {MaxConns: hotWorkers, MaxWaiting: tenantdb.Unbounded}},
			Database: dbOf,
			Logger:   slog.New(slog.DiscardHandler),
		})
		if err != nil {
			b.Fatal(err)
		}
		run := runDatabases(b, func(tenant string) error {
			return p.QueryRow(tenantdb.WithTenant(ctx, tenant), "select 1").Scan(new(int))
		})
		st := p.DatabasesStat()
		var hotOpens int64
		for _, d := range p.AppendDatabaseStat(nil) {
			if d.Database == "bench_000" {
				hotOpens = d.Opens
			}
		}
		p.Close()
		run.report(b, "budget", float64(st.Opens-hotOpens)/coldCalls, st.ConnectTime/time.Duration(max(st.Opens, 1)), hotOpens-hotWorkers)

		// A pgxpool per database.
		var mu sync.Mutex
		var opens, connecting atomic.Int64
		raw := map[string]*pgxpool.Pool{}
		poolOf := func(tenant string) *pgxpool.Pool {
			mu.Lock()
			defer mu.Unlock()
			if pp := raw[tenant]; pp != nil {
				return pp
			}
			cfg := template.Copy()
			cfg.MaxConns = perDBMaxConns
			cfg.ConnConfig.Database, _ = dbOf(tenant)
			var started time.Time
			cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error { started = time.Now(); return nil }
			cfg.AfterConnect = func(context.Context, *pgx.Conn) error {
				opens.Add(1)
				connecting.Add(int64(time.Since(started)))
				return nil
			}
			pp, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				b.Fatal(err)
			}
			raw[tenant] = pp
			return pp
		}
		run = runDatabases(b, func(tenant string) error {
			return poolOf(tenant).QueryRow(ctx, "select 1").Scan(new(int))
		})
		hot := raw["000"].Stat().NewConnsCount()
		for _, pp := range raw {
			pp.Close()
		}
		run.report(b, "pool-per-db", float64(opens.Load()-hot)/coldCalls,
			time.Duration(connecting.Load()/max(opens.Load(), 1)), hot-hotWorkers)
	}
}

// dbRun is what one run of the workload measured.
type dbRun struct {
	hot, cold []time.Duration
	peak      int // the most of the run's connections pg_stat_activity counted
}

// runDatabases runs the workload with call(tenant), tenant "000" the hot
// one, and samples the server's count of the benchmark's connections.
func runDatabases(b *testing.B, call func(tenant string) error) dbRun {
	b.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, postgres(b).DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	var r dbRun
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg, hot sync.WaitGroup
	wg.Go(func() { // the sampler
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var n int
			if err := admin.QueryRow(ctx, "select count(*) from pg_stat_activity where application_name = 'bench-dbper'").Scan(&n); err == nil {
				r.peak = max(r.peak, n)
			}
		}
	})
	for range hotWorkers {
		hot.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				if err := call("000"); err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				r.hot = append(r.hot, time.Since(start))
				mu.Unlock()
			}
		})
	}
	var next atomic.Int64
	var cold sync.WaitGroup
	for range coldWorkers {
		cold.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= coldCalls {
					return
				}
				tenant := fmt.Sprintf("%03d", 1+i%(benchDatabases-1))
				start := time.Now()
				if err := call(tenant); err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				r.cold = append(r.cold, time.Since(start))
				mu.Unlock()
			}
		})
	}
	cold.Wait()
	close(stop)
	hot.Wait()
	wg.Wait()
	return r
}

func (r dbRun) report(b *testing.B, name string, churn float64, connect time.Duration, hotReopens int64) {
	q := func(ds []time.Duration, f float64) float64 {
		slices.Sort(ds)
		return float64(ds[int(f*float64(len(ds)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(q(r.hot, 0.5), name+"-hot-p50-ms")
	b.ReportMetric(q(r.hot, 0.99), name+"-hot-p99-ms")
	b.ReportMetric(q(r.cold, 0.5), name+"-cold-p50-ms")
	b.ReportMetric(q(r.cold, 0.99), name+"-cold-p99-ms")
	b.ReportMetric(churn, name+"-opens/cold-call")
	b.ReportMetric(float64(connect.Microseconds())/1000, name+"-open-ms")
	b.ReportMetric(float64(hotReopens), name+"-hot-reopens")
	b.ReportMetric(float64(r.peak), name+"-server-conns")
}

// createBenchDatabases makes the databases bench_000 to bench_NNN from one
// template, keeping those a run before made on the same server.
func createBenchDatabases(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, postgres(b).DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	rows, _ := admin.Query(ctx, "select datname from pg_database")
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatal(err)
	}
	for i := range benchDatabases {
		name := fmt.Sprintf("bench_%03d", i)
		if slices.Contains(names, name) {
			continue
		}
		if _, err := admin.Exec(ctx, "create database "+name+" strategy file_copy"); err != nil {
			b.Fatal(err)
		}
	}
}
