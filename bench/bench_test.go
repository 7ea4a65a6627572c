package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
)

var (
	pgOnce sync.Once
	pg     *tenantdbtest.Postgres
	pgErr  error
)

// postgres starts the server the first time a benchmark needs it, so that a
// plain `go test ./...` starts nothing for this package.
func postgres(b *testing.B) *tenantdbtest.Postgres {
	b.Helper()
	pgOnce.Do(func() { pg, pgErr = tenantdbtest.RunPostgres(context.Background()) })
	if pgErr != nil {
		b.Fatal(pgErr)
	}
	return pg
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pg != nil {
		pg.Terminate(context.Background())
	}
	os.Exit(code)
}

const maxConns = 20

func pgxConfig(b *testing.B) *pgxpool.Config {
	cfg, err := pgxpool.ParseConfig(postgres(b).DSN)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = maxConns, maxConns
	return cfg
}

// pools returns a raw pgxpool and a tenantdb.Pool on the same server, each
// with every connection open.
func pools(b *testing.B, cfg tenantdb.Config) (*pgxpool.Pool, *tenantdb.Pool) {
	b.Helper()
	raw, err := pgxpool.NewWithConfig(context.Background(), pgxConfig(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(raw.Close)
	p, err := tenantdb.New(context.Background(), pgxConfig(b), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	// pgxpool opens MinConns in the background, and TotalConns counts the
	// connections still being opened: wait until every one is open and idle,
	// so that no benchmark runs beside 2 × maxConns connects (tenantdb's
	// with their hooks' queries) and the server's backends starting.
	for _, pp := range []*pgxpool.Pool{raw, p.Pgxpool()} {
		tenantdbtest.Eventually(b, time.Minute, "every connection open and idle", func() bool {
			return pp.Stat().IdleConns() == maxConns
		})
	}
	return raw, p
}

var plans = tenantdb.Config{Plans: map[string]tenantdb.Plan{"standard": {MaxConns: 10, MaxWaiting: 100}}}

// BenchmarkAcquireRelease is the cost of the bulkhead itself: a connection
// taken and given back for one tenant, no query. Target: tenantdb at most
// 1.3x raw pgxpool, with no extra allocation. pgxpool and tenantdb run each
// side alone, for its allocations. interleaved runs both in turns of
// acquireBlock, so that the two sides share whatever the machine does
// meanwhile, and times each turn twice: pgxpool-ns/op and tenantdb-ns/op
// are wall time, x-pgxpool their ratio; the cpu- metrics (Linux) are the
// CPU time the benchmark's thread used, which a busy machine does not
// inflate, and x-pgxpool-cpu is their ratio.
func BenchmarkAcquireRelease(b *testing.B) {
	raw, p := pools(b, plans)
	ctx := tenantdb.WithTenant(context.Background(), "acme")
	rawOnce := func() {
		c, err := raw.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		c.Release()
	}
	tenantOnce := func() {
		c, err := p.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		c.Release()
	}
	for _, side := range []struct {
		name string
		once func()
	}{{"pgxpool", rawOnce}, {"tenantdb", tenantOnce}} {
		b.Run(side.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				side.once()
			}
		})
	}
	b.Run("interleaved", func(b *testing.B) {
		runtime.LockOSThread() // for threadCPU
		defer runtime.UnlockOSThread()
		var wall, cpu [2]time.Duration // pgxpool's, tenantdb's
		_, cpuOK := threadCPU()
		turn := func(side int, once func()) {
			start := time.Now()
			cpuStart, _ := threadCPU()
			for range acquireBlock {
				once()
			}
			cpuEnd, _ := threadCPU()
			wall[side] += time.Since(start)
			cpu[side] += cpuEnd - cpuStart
		}
		n := 0
		for b.Loop() {
			// Alternate which side goes first, so that neither always
			// finds the caches as the other left them.
			if n%2 == 0 {
				turn(0, rawOnce)
				turn(1, tenantOnce)
			} else {
				turn(1, tenantOnce)
				turn(0, rawOnce)
			}
			n++
		}
		perOp := func(d time.Duration) float64 { return float64(d) / float64(n*acquireBlock) }
		b.ReportMetric(perOp(wall[0]), "pgxpool-ns/op")
		b.ReportMetric(perOp(wall[1]), "tenantdb-ns/op")
		b.ReportMetric(float64(wall[1])/float64(wall[0]), "x-pgxpool")
		if cpuOK {
			b.ReportMetric(perOp(cpu[0]), "pgxpool-cpu-ns/op")
			b.ReportMetric(perOp(cpu[1]), "tenantdb-cpu-ns/op")
			b.ReportMetric(float64(cpu[1])/float64(cpu[0]), "x-pgxpool-cpu")
		}
	})
}

// acquireBlock is how many acquires BenchmarkAcquireRelease/interleaved
// times at once: enough that reading the clock costs nothing next to them,
// few enough that both sides see the same load.
const acquireBlock = 500

// BenchmarkExec is a round trip to the server. Target: tenantdb within 3%.
func BenchmarkExec(b *testing.B) {
	raw, p := pools(b, plans)
	ctx := tenantdb.WithTenant(context.Background(), "acme")
	for _, db := range []struct {
		name string
		exec func() error
	}{
		{"pgxpool", func() error { _, err := raw.Exec(ctx, "select 1"); return err }},
		{"tenantdb", func() error { _, err := p.Exec(ctx, "select 1"); return err }},
	} {
		b.Run(db.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := db.exec(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParallelTenants runs Exec("select 1") from many goroutines spread
// over n tenants, next to raw pgxpool under the same load.
func BenchmarkParallelTenants(b *testing.B) {
	raw, p := pools(b, tenantdb.Config{Plans: map[string]tenantdb.Plan{"standard": {MaxConns: maxConns, MaxWaiting: tenantdb.Unbounded}}})
	b.Run("pgxpool", func(b *testing.B) {
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := raw.Exec(context.Background(), "select 1"); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	for _, n := range []int{1, 100, 10_000} {
		ctxs := make([]context.Context, n)
		for i := range ctxs {
			ctxs[i] = tenantdb.WithTenant(context.Background(), fmt.Sprintf("tenant-%d", i))
		}
		b.Run(fmt.Sprintf("tenantdb/tenants=%d", n), func(b *testing.B) {
			var next atomic.Uint64
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ctx := ctxs[next.Add(1)%uint64(n)]
					if _, err := p.Exec(ctx, "select 1"); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkTracing is Exec("select 1") through tenantdb with tracing off,
// on but not sampled, and on and sampled (spans recorded by the SDK and
// dropped, no exporter).
func BenchmarkTracing(b *testing.B) {
	for _, c := range []struct {
		name   string
		tracer func() *tracing.Tracer
		ctx    func(context.Context) context.Context
	}{
		{"off", func() *tracing.Tracer { return nil }, func(ctx context.Context) context.Context { return ctx }},
		{"unsampled", func() *tracing.Tracer {
			return tracing.New(tracing.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))))
		}, func(ctx context.Context) context.Context { return ctx }},
		{"sampled", func() *tracing.Tracer {
			return tracing.New(tracing.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))))
		}, func(ctx context.Context) context.Context {
			// A request span, as otelhttp would start, for ours to nest under.
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
			ctx, _ = tp.Tracer("bench").Start(ctx, "request")
			return ctx
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg := plans
			if tr := c.tracer(); tr != nil {
				cfg.Tracer = tr
			}
			_, p := pools(b, cfg)
			ctx := c.ctx(tenantdb.WithTenant(context.Background(), "acme"))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Exec(ctx, "select 1"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSessionState is the cost of tenantdb.Config.Session: the round
// trip that sets a tenant's session state on each acquire. Each iteration
// runs Exec("select 1") once on a pool without it and once on each pool with
// it, in turn, so that the machine's drift falls on all alike; the metrics
// are each pool's time per Exec.
func BenchmarkSessionState(b *testing.B) {
	ctx := tenantdb.WithTenant(context.Background(), "acme")
	variants := []struct {
		name    string
		session tenantdb.Session
	}{
		{"off", tenantdb.Session{}},
		{"setting", tenantdb.Session{TenantSetting: "app.tenant_id"}},
		{"setting+search_path", tenantdb.Session{
			TenantSetting: "app.tenant_id",
			SearchPath:    func(id string) []string { return []string{"tenant_" + id, "public"} },
		}},
	}
	pools := make([]*tenantdb.Pool, len(variants))
	for i, v := range variants {
		cfg := plans
		cfg.Session = v.session
		p, err := tenantdb.New(context.Background(), pgxConfig(b), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
		for range 2 { // warm: connect, and prepare the setup statement
			if _, err := p.Exec(ctx, "select 1"); err != nil {
				b.Fatal(err)
			}
		}
		pools[i] = p
	}
	// spent[i] is pool i's time for a tenant's Exec; system[i], for one
	// without a tenant through Pgxpool(), whose setup restores the defaults.
	spent := make([]time.Duration, len(variants))
	system := make([]time.Duration, len(variants))
	n := 0
	for b.Loop() {
		for i, p := range pools {
			start := time.Now()
			if _, err := p.Exec(ctx, "select 1"); err != nil {
				b.Fatal(err)
			}
			mid := time.Now()
			if _, err := p.Pgxpool().Exec(context.Background(), "select 1"); err != nil {
				b.Fatal(err)
			}
			spent[i] += mid.Sub(start)
			system[i] += time.Since(mid)
		}
		n++
	}
	for i, v := range variants {
		b.ReportMetric(float64(spent[i].Nanoseconds())/float64(n), v.name+"-ns/exec")
		b.ReportMetric(float64(system[i].Nanoseconds())/float64(n), v.name+"-notenant-ns/exec")
	}
	b.ReportMetric(0, "ns/op")
}
