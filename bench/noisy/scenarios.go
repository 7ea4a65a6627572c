package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
)

const (
	sharedConns  = 20 // the shared pool's MaxConns
	perTenantCap = 10 // each tenant's cap behind tenantdb
)

type scenario struct {
	name, about string
	run         func(ctx context.Context, env *environment, name string) ([]result, error)
}

// scenarios run in this order; their names are what -scenarios selects.
var scenarios = []scenario{
	{"shared", "raw pgxpool, MaxConns 20: the shared limit alone", runShared},
	{"queue", "tenantdb, 10 per tenant, a queue large enough for the burst", runTenantdb(plansQueue)},
	{"reject", "tenantdb, 10 per tenant, excess rejected", runTenantdb(plansReject)},
	{"fair", "tenantdb, oversubscribed plans: noisy may take all 20, quiet's plan weighs 4x and reserves 4", runTenantdb(plansFair(4))},
	{"fair-noreserve", "as fair, without the reservation", runTenantdb(plansFair(0))},
	{"pgbouncer", "PgBouncer, one database user per tenant, max_user_connections=10, max_db_connections=20", runPgBouncer},
	{"queue-adaptive", "as queue, with adaptive limits: waiting-type work must keep its cap", runTenantdb(adaptive(plansQueue))},
	{"reject-adaptive", "as reject, with adaptive limits: only requests over the cap are rejected", runTenantdb(adaptive(plansReject))},
	{"fair-adaptive", "as fair, with adaptive limits", runTenantdb(adaptive(plansFair(4)))},
	{"cpu-static10", "CPU-bound noisy scans on a one-CPU PostgreSQL, static cap 10", runCPUBound(perTenantCap, false)},
	{"cpu-static2", "as cpu-static10, static cap 2", runCPUBound(2, false)},
	{"cpu-adaptive", "as cpu-static10, with adaptive limits", runCPUBound(perTenantCap, true)},
	{"oracle-cpu", "adaptive limits against static caps 1, 2, 4, 10 in interleaved rounds: CPU-bound scans", runOracle},
	{"oracle-sleep", "as oracle-cpu: pg_sleep waits", runOracle},
	{"oracle-mix", "as oracle-cpu: the noisy tenant alternates between bursts of scans and of waits", runOracle},
	{"oracle-multi", "as oracle-cpu: three noisy tenants at once; also the try-once schedule", runOracle},
	{"oracle-turns", "as oracle-cpu: scans and waits in turn within one burst; also the try-once schedule", runOracle},
	{"oracle-flood", "a flood that only waits (100 x pg_sleep(0.5), cap 10) against its ideal 5 s: static 10 and adaptive", runOracle},
	{"own-queue", "issue 27: acme's import (noisy) and its users' reads (quiet) in one tenant, cap 10, queueing over it", runOwnTenant(classPlans(true, false))},
	{"own-reject", "as own-queue, rejecting over the cap", runOwnTenant(classPlans(false, false))},
	{"class-queue", "as own-queue, the import in a batch class of 6 of acme's 10", runOwnTenant(classPlans(true, true))},
	{"class-reject", "as own-reject, the import in a batch class of 6 (which queues)", runOwnTenant(classPlans(false, true))},
	{"class-tenants", "the import as five tenants' batch work (6 each, MaxShare 0.75 of 20) beside a sixth tenant's reads", runClassTenants},
	{"http-shared", "HTTP through poolhttp.Middleware on loopback, every request in one bucket of 20: the shared limit alone", runHTTP(httpShared)},
	{"http-queue", "HTTP through poolhttp.Middleware, 10 per tenant, a queue large enough for the burst", runHTTP(httpQueue)},
	{"http-reject", "HTTP through poolhttp.Middleware, 10 per tenant, excess answered 429 with Retry-After", runHTTP(httpReject)},
}

// adaptive turns adaptive limits on in a scenario's configuration.
func adaptive(plans func(workload) tenantdb.Config) func(workload) tenantdb.Config {
	return func(w workload) tenantdb.Config {
		c := plans(w)
		c.Adaptive.Enabled = true
		return c
	}
}

func scenarioNames() []string {
	var names []string
	for _, s := range scenarios {
		names = append(names, s.name)
	}
	return names
}

// environment is what every scenario shares.
type environment struct {
	pg       *tenantdbtest.Postgres
	external bool                   // pg is the -dsn server, not one started here
	cpuset   string                 // CPUs for the CPU-bound scenarios' server
	rounds   int                    // of the oracle-* scenarios
	out      string                 // -out: where the oracle-* scenarios write their timelines
	cpuPG    *tenantdbtest.Postgres // started by the first CPU-bound scenario
	work     workload
	tracer   *tracing.Tracer // nil unless -otlp or -metrics
	// observe registers each tenantdb pool's gauges with the tracer
	// (-metrics): they are read at each scrape.
	observe bool
	closers []func() // in reverse order by close
}

func newEnvironment(ctx context.Context, pg *tenantdbtest.Postgres, opts options) (*environment, error) {
	env := &environment{pg: pg, external: opts.dsn != "", cpuset: opts.cpuset, rounds: opts.rounds, out: opts.out, work: newWorkload(opts.scale)}
	// Two tenants, both worth a label of their own from their first
	// request: the default TopTenants labels a tenant only once a
	// collection has seen it busy, after the noisy burst has begun.
	trOpts := []tracing.Option{tracing.WithCardinality(tracing.ByTenant(10))}
	for _, setup := range []struct {
		on bool
		f  func() ([]tracing.Option, func(), error)
	}{
		{opts.otlp != "", func() ([]tracing.Option, func(), error) { return otlpTracing(ctx, opts.otlp) }},
		{opts.metrics != "", func() ([]tracing.Option, func(), error) { return serveMetrics(opts.metrics) }},
	} {
		if !setup.on {
			continue
		}
		o, closeFn, err := setup.f()
		if err != nil {
			env.close()
			return nil, err
		}
		trOpts = append(trOpts, o...)
		env.closers = append(env.closers, closeFn)
	}
	if opts.otlp != "" || opts.metrics != "" {
		env.tracer = tracing.New(trOpts...)
		env.observe = opts.metrics != ""
	}
	return env, nil
}

func (env *environment) close() {
	for i := len(env.closers) - 1; i >= 0; i-- {
		env.closers[i]()
	}
}

// pgxConfig is the shared pool every scenario but pgbouncer uses: 20
// connections, all opened before the run so that connecting is not
// mistaken for waiting.
func (env *environment) pgxConfig(dsn string, conns int32) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = conns, conns
	if env.tracer != nil {
		cfg.ConnConfig.Tracer = env.tracer // query spans for the raw scenarios too
	}
	return cfg, nil
}

// warm waits until a pool has all its connections open, then runs the
// quiet tenant's query once on every one of them at the same time, so that
// the first query of a backend (catalog caches, pgx's statement preparation,
// pgxpool's ping of an idle connection) is not mistaken for waiting.
func warm(ctx context.Context, p *pgxpool.Pool, w workload) error {
	want := p.Config().MinConns
	for p.Stat().TotalConns() < want {
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range want {
		c, err := p.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	errs := make(chan error, len(conns))
	for _, c := range conns {
		go func() {
			_, err := c.Exec(ctx, sleepSQL("quiet", w.quietSleep))
			errs <- err
		}()
	}
	for range conns {
		if err := <-errs; err != nil {
			return fmt.Errorf("warming up: %w", err)
		}
	}
	return nil
}

// measure runs the quiet tenant alone, then the flood, and returns the rows.
func (env *environment) measure(ctx context.Context, name string, q queryFunc) []result {
	alone := env.work.quietAlone(ctx, q)
	noisy, quiet := env.work.flood(ctx, name, q)
	return []result{noisy.result(name, "noisy"), quiet.result(name, "quiet"), alone.result(name, "quiet-unloaded")}
}

func runShared(ctx context.Context, env *environment, name string) ([]result, error) {
	cfg, err := env.pgxConfig(env.pg.DSN, sharedConns)
	if err != nil {
		return nil, err
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if err := warm(ctx, p, env.work); err != nil {
		return nil, err
	}
	return env.measure(ctx, name, func(ctx context.Context, tenant string, d time.Duration) error {
		_, err := p.Exec(ctx, sleepSQL(tenant, d))
		return err
	}), nil
}

func plansQueue(w workload) tenantdb.Config {
	return tenantdb.Config{Plans: map[string]tenantdb.Plan{
		"standard": {MaxConns: perTenantCap, MaxWaiting: w.noisyN},
	}}
}

func plansReject(workload) tenantdb.Config {
	return tenantdb.Config{Plans: map[string]tenantdb.Plan{
		"interactive": {MaxConns: perTenantCap}, // MaxWaiting 0: reject over the cap
	}}
}

// plansFair oversubscribes: each plan may take the whole pool, so what the
// tenants get is decided by the fair gate (weights) and the reservation.
func plansFair(reserved int) func(workload) tenantdb.Config {
	return func(w workload) tenantdb.Config {
		return tenantdb.Config{
			Plans: map[string]tenantdb.Plan{
				"bulk":       {MaxConns: sharedConns, MaxWaiting: w.noisyN, Weight: 1},
				"enterprise": {MaxConns: sharedConns, MaxWaiting: w.quietN, Weight: 4, ReservedConns: reserved},
			},
			DefaultPlan: "bulk",
			Lookup: func(_ context.Context, id string) (tenantdb.Tenant, error) {
				if id == "quiet" {
					return tenantdb.Tenant{Plan: "enterprise"}, nil
				}
				return tenantdb.Tenant{}, nil
			},
		}
	}
}

// openTenantdb opens a tenantdb pool on cfg for a scenario, traced (and its
// gauges observed) as the environment says, with its connections warmed. The
// returned func closes it.
func (env *environment) openTenantdb(ctx context.Context, cfg *pgxpool.Config, tcfg tenantdb.Config) (*tenantdb.Pool, func(), error) {
	if env.tracer != nil {
		tcfg.Tracer = env.tracer
		cfg.ConnConfig.Tracer = nil // tenantdb.New chains the tracer's query hooks itself
	}
	p, err := tenantdb.New(ctx, cfg, tcfg)
	if err != nil {
		return nil, nil, err
	}
	closePool := p.Close
	if env.observe {
		stop, err := env.tracer.ObservePool(p)
		if err != nil {
			p.Close()
			return nil, nil, err
		}
		closePool = func() { stop(); p.Close() }
	}
	if err := warm(ctx, p.Pgxpool(), env.work); err != nil {
		closePool()
		return nil, nil, err
	}
	return p, closePool, nil
}

func runTenantdb(plans func(workload) tenantdb.Config) func(context.Context, *environment, string) ([]result, error) {
	return func(ctx context.Context, env *environment, name string) ([]result, error) {
		cfg, err := env.pgxConfig(env.pg.DSN, sharedConns)
		if err != nil {
			return nil, err
		}
		p, closePool, err := env.openTenantdb(ctx, cfg, plans(env.work))
		if err != nil {
			return nil, err
		}
		defer closePool()
		rows := env.measure(ctx, name, func(ctx context.Context, tenant string, d time.Duration) error {
			_, err := p.Exec(tenantdb.WithTenant(ctx, tenant), sleepSQL(tenant, d))
			return err
		})
		if s := p.Stat().Tenants; s.InUse != 0 || s.Waiting != 0 {
			return nil, fmt.Errorf("after the run %d slots are in use and %d waiting", s.InUse, s.Waiting)
		}
		return rows, nil
	}
}
