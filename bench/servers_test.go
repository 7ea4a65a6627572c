package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// The servers workload: 300 tenants over three servers with a budget of 10
// each, tenant tNNN on server s(NNN%3).
const (
	srvTenants = 300
	srvBudget  = 10
)

// BenchmarkServers runs three PostgreSQL servers and measures, in one run:
//
//   - noisy: quiet tenants of s1 and s2 each run 5 ms statements one after
//     another, first alone, then while 40 tenants of s0 keep 4 one-second
//     statements each going; their p50 under the noise over their p50 alone;
//   - move: a tenant sending 50 calls a second of 20 ms statements (each
//     with a 5 s deadline) moved from s0 to s1: failed calls, the move's
//     pause, the longest call;
//   - down: s2 stopped: after its first failed call, how long its tenants'
//     calls take to fail, and the quiet tenants of s0 and s1 meanwhile.
func BenchmarkServers(b *testing.B) {
	ctx := context.Background()
	names := []string{"s0", "s1", "s2"}
	pgs := map[string]*tenantdbtest.Postgres{}
	for _, name := range names {
		pg, err := tenantdbtest.RunPostgres(ctx, tenantdbtest.WithSetting("cluster_name", name))
		if err != nil {
			b.Fatal(err)
		}
		defer pg.Terminate(ctx)
		pgs[name] = pg
	}
	var mu sync.Mutex
	moved := map[string]tenantdb.Placement{"mover": {Server: "s0"}}
	servers := map[string]*pgxpool.Config{}
	for _, name := range names {
		c, err := pgxpool.ParseConfig(pgs[name].DSN)
		if err != nil {
			b.Fatal(err)
		}
		c.MaxConns = srvBudget
		c.ConnConfig.ConnectTimeout = 5 * time.Second
		servers[name] = c
	}
	for b.Loop() {
		p, err := tenantdb.NewServers(ctx, servers, tenantdb.Config{
			Plans:     map[string]tenantdb.Plan{"p": {MaxConns: 4, MaxWaiting: tenantdb.Unbounded}},
			LookupTTL: 100 * time.Millisecond,
			Logger:    slog.New(slog.DiscardHandler),
			Placement: func(_ context.Context, id string) (tenantdb.Placement, error) {
				mu.Lock()
				at, ok := moved[id]
				mu.Unlock()
				if ok {
					return at, nil
				}
				var n int
				if _, err := fmt.Sscanf(id, "t%d", &n); err != nil {
					return tenantdb.Placement{}, err
				}
				return tenantdb.Placement{Server: names[n%3]}, nil
			},
		})
		if err != nil {
			b.Fatal(err)
		}
		call := func(ctx context.Context, tenant, sql string) (time.Duration, error) {
			start := time.Now()
			_, err := p.Exec(tenantdb.WithTenant(ctx, tenant), sql)
			return time.Since(start), err
		}
		// quiet runs 5 ms statements for each of tenants, one after another,
		// for d, and returns their latencies.
		quiet := func(tenants []string, d time.Duration) []time.Duration {
			var mu sync.Mutex
			var all []time.Duration
			var wg sync.WaitGroup
			for _, tenant := range tenants {
				wg.Go(func() {
					for end := time.Now().Add(d); time.Now().Before(end); {
						took, err := call(ctx, tenant, "select pg_sleep(0.005)")
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						all = append(all, took)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			return all
		}
		quietTenants := []string{"t001", "t004", "t007", "t002", "t005", "t008"} // 3 on s1, 3 on s2
		for i := range srvTenants {                                              // warm: each tenant's connection once
			if _, err := call(ctx, fmt.Sprintf("t%03d", i), "select 1"); err != nil {
				b.Fatal(err)
			}
		}

		// noisy
		alone := quiet(quietTenants, 3*time.Second)
		stop := make(chan struct{})
		var noise sync.WaitGroup
		var noisy atomic.Int64
		for i := 0; i < 40; i++ {
			tenant := fmt.Sprintf("t%03d", 3*i) // on s0
			for range 4 {
				noise.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := call(ctx, tenant, "select pg_sleep(1)"); err == nil {
							noisy.Add(1)
						}
					}
				})
			}
		}
		time.Sleep(500 * time.Millisecond) // let the noise fill s0: a warm-up, not synchronisation
		loaded := quiet(quietTenants, 3*time.Second)
		close(stop)
		noise.Wait()
		b.ReportMetric(q(alone, 0.5), "quiet-alone-p50-ms")
		b.ReportMetric(q(loaded, 0.5), "quiet-noisy-p50-ms")
		b.ReportMetric(q(loaded, 0.5)/q(alone, 0.5), "quiet-p50-ratio")
		b.Logf("noisy: quiet p50 %.2f ms alone, %.2f ms with s0 full (%d noisy statements); p99 %.2f / %.2f ms",
			q(alone, 0.5), q(loaded, 0.5), noisy.Load(), q(alone, 0.99), q(loaded, 0.99))

		// move
		var wg sync.WaitGroup
		var failed, served atomic.Int64
		var longest atomic.Int64
		tick := time.NewTicker(20 * time.Millisecond)
		var pause time.Duration
		moveDone := make(chan error, 1)
		start := time.Now()
		for i := 0; time.Since(start) < 3*time.Second; i++ {
			<-tick.C
			if i == 50 {
				go func() {
					began := time.Now()
					err := p.Move(ctx, "mover", tenantdb.Placement{Server: "s1"}, time.Second, func(context.Context) error {
						mu.Lock()
						moved["mover"] = tenantdb.Placement{Server: "s1"}
						mu.Unlock()
						return nil
					})
					pause = time.Since(began)
					moveDone <- err
				}()
			}
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				took, err := call(cctx, "mover", "select pg_sleep(0.02)")
				if err != nil {
					failed.Add(1)
					return
				}
				served.Add(1)
				for old := longest.Load(); int64(took) > old && !longest.CompareAndSwap(old, int64(took)); old = longest.Load() {
				}
			})
		}
		tick.Stop()
		wg.Wait()
		if err := <-moveDone; err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(failed.Load()), "move-failed-calls")
		b.ReportMetric(float64(pause)/1e6, "move-pause-ms")
		b.ReportMetric(float64(longest.Load())/1e6, "move-longest-call-ms")
		b.Logf("move: %d calls served, %d failed; pause %v; longest call %v", served.Load(), failed.Load(),
			pause.Round(time.Millisecond), time.Duration(longest.Load()).Round(time.Millisecond))

		// down
		before := quiet([]string{"t000", "t003", "t001", "t004"}, 2*time.Second) // s0 and s1
		if err := pgs["s2"].Stop(ctx); err != nil {
			b.Fatal(err)
		}
		for range 50 { // until a connect fails and s2 is known down
			if _, err := call(ctx, "t002", "select 1"); errors.Is(err, tenantdb.ErrServerDown) {
				break
			}
		}
		var downs []time.Duration
		var dmu sync.Mutex
		downStop := make(chan struct{})
		var dwg sync.WaitGroup
		for _, tenant := range []string{"t002", "t005", "t008"} {
			dwg.Go(func() {
				for {
					select {
					case <-downStop:
						return
					default:
					}
					took, err := call(ctx, tenant, "select 1")
					if errors.Is(err, tenantdb.ErrServerDown) {
						dmu.Lock()
						downs = append(downs, took)
						dmu.Unlock()
					}
					time.Sleep(time.Millisecond) // the calls' rate, not synchronisation
				}
			})
		}
		during := quiet([]string{"t000", "t003", "t001", "t004"}, 2*time.Second)
		close(downStop)
		dwg.Wait()
		if err := pgs["s2"].Start(ctx); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(q(downs, 0.5), "down-fail-p50-ms")
		b.ReportMetric(q(downs, 1), "down-fail-max-ms")
		b.ReportMetric(q(during, 0.5)/q(before, 0.5), "down-others-p50-ratio")
		b.Logf("down: %d calls of s2 failed with ErrServerDown, p50 %.3f ms, max %.3f ms; others' p50 %.2f ms before, %.2f ms during",
			len(downs), q(downs, 0.5), q(downs, 1), q(before, 0.5), q(during, 0.5))
		p.Close()
	}
}

// q is the f quantile of ds, in milliseconds.
func q(ds []time.Duration, f float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, int(f*float64(len(s))))
	return float64(s[i]) / 1e6
}
