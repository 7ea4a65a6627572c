package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// The CPU-bound scenarios (issue 11): pg_sleep uses no database CPU, so it
// cannot show what a noisy tenant whose queries burn CPU does to the others.
// Here PostgreSQL runs on one CPU; the noisy tenant sends cpuNoisyN scans
// computing md5 over 300,000 rows at once; the quiet tenant reads 200 rows by
// a key range every cpuQuietPace while they run. Static caps against adaptive
// limits.
const (
	cpuNoisyN    = 60
	cpuNoisySQL  = "select count(*) from cpu_rows where md5(payload || $1::text) < '1' /* tenant=noisy */"
	cpuQuietSQL  = "select count(*) from cpu_rows where id between $1 and $1 + 199 and md5(payload) < '8' /* tenant=quiet */"
	cpuQuietPace = 5 * time.Millisecond
	cpuUnloadedN = 300
)

// cpuFixture is testdata/cpu_bound.sql, found from this file's path, as the
// command runs with go run from the module.
func cpuFixture() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("cannot locate the source to find testdata/cpu_bound.sql")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "cpu_bound.sql"), nil
}

// cpuPostgres starts, once, the PostgreSQL confined to one CPU that the
// CPU-bound scenarios share.
func (env *environment) cpuPostgres(ctx context.Context) (*tenantdbtest.Postgres, error) {
	if env.cpuPG != nil {
		return env.cpuPG, nil
	}
	if env.external {
		return nil, skipError{"needs a PostgreSQL confined to one CPU, which only a container started here has (no -dsn)"}
	}
	fixture, err := cpuFixture()
	if err != nil {
		return nil, err
	}
	progress("starting a PostgreSQL confined to CPU %s for the CPU-bound scenarios", env.cpuset)
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	pg, err := tenantdbtest.RunPostgres(startCtx,
		tenantdbtest.WithCPUSet(env.cpuset),
		tenantdbtest.WithInitScripts(fixture),
		tenantdbtest.WithSetting("max_parallel_workers_per_gather", "0"), // one query, one backend, one core's work
		tenantdbtest.WithSetting("jit", "off"),
		// Loading the fixture on one CPU of a busy machine can outlast the
		// default two minutes.
		tenantdbtest.WithPostgresStartupTimeout(4*time.Minute))
	if err != nil {
		return nil, reaperHint(err)
	}
	env.cpuPG = pg
	env.closers = append(env.closers, func() { pg.Terminate(context.Background()) })
	return pg, nil
}

// runCPUBound is a CPU-bound scenario: the noisy tenant capped at cap,
// with adaptive limits or not.
func runCPUBound(cap int, adaptive bool) func(context.Context, *environment, string) ([]result, error) {
	return func(ctx context.Context, env *environment, name string) ([]result, error) {
		pg, err := env.cpuPostgres(ctx)
		if err != nil {
			return nil, err
		}
		cfg, err := env.pgxConfig(pg.DSN, sharedConns)
		if err != nil {
			return nil, err
		}
		tcfg := tenantdb.Config{
			Plans:    map[string]tenantdb.Plan{"standard": {MaxConns: cap, MaxWaiting: tenantdb.Unbounded}},
			Adaptive: tenantdb.Adaptive{Enabled: adaptive},
		}
		p, closePool, err := env.openTenantdb(ctx, cfg, tcfg)
		if err != nil {
			return nil, err
		}
		defer closePool()
		// One scan first, so that the table is in shared buffers for every scenario.
		if _, err := p.Exec(tenantdb.WithTenant(ctx, "warm"), cpuNoisySQL, "warm"); err != nil {
			return nil, err
		}
		progress("%s: quiet tenant alone (its unloaded latency)", name)
		alone := cpuReads(ctx, p, cpuUnloadedN, nil)
		progress("%s: noisy %d CPU-bound scans at once, quiet reads every %v meanwhile", name, cpuNoisyN, cpuQuietPace)
		noisy, quiet, maxLimit := cpuFlood(ctx, p, name)
		if s := p.Stat().Tenants; s.InUse != 0 || s.Waiting != 0 {
			return nil, fmt.Errorf("after the run %d slots are in use and %d waiting", s.InUse, s.Waiting)
		}
		progress("%s: noisy tenant's effective limit reached at most %d", name, maxLimit)
		return []result{noisy.result(name, "noisy"), quiet.result(name, "quiet"), alone.result(name, "quiet-unloaded")}, nil
	}
}

// cpuReads runs the quiet tenant's reads on a fixed schedule, whether or not
// earlier ones are done (so it asks for the same work however slow it is),
// until stop closes or, when n > 0, n have run.
func cpuReads(ctx context.Context, p *tenantdb.Pool, n int, stop <-chan struct{}) *outcome {
	var o outcome
	var mu sync.Mutex
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(7, 11))
	start := time.Now()
	for i := 0; n <= 0 || i < n; i++ {
		select {
		case <-stop:
			wg.Wait()
			return &o
		case <-ctx.Done():
			wg.Wait()
			return &o
		case <-time.After(time.Until(start.Add(time.Duration(i) * cpuQuietPace))):
		}
		id := 1 + rng.IntN(300_000-200)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			_, err := p.Exec(tenantdb.WithTenant(ctx, "quiet"), cpuQuietSQL, id)
			mu.Lock()
			o.record(time.Since(t0), err, time.Since(start))
			mu.Unlock()
		}()
	}
	wg.Wait()
	return &o
}

// cpuFlood sends the noisy scans at once and the quiet reads until the scans
// are done; it returns both outcomes and the noisy tenant's highest
// effective limit seen.
func cpuFlood(ctx context.Context, p *tenantdb.Pool, name string) (noisy, quiet *outcome, maxLimit int) {
	noisy = &outcome{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i := range cpuNoisyN {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			_, err := p.Exec(tenantdb.WithTenant(ctx, "noisy"), cpuNoisySQL, fmt.Sprint(i))
			mu.Lock()
			noisy.record(time.Since(t0), err, time.Since(start))
			mu.Unlock()
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	watched := make(chan int)
	go func() { // the effective limit and progress, once every 100 ms
		most, last := 0, time.Now()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			most = max(most, p.TenantStat("noisy").EffectiveLimit)
			select {
			case <-done:
				watched <- most
				return
			case <-tick.C:
			}
			if time.Since(last) >= time.Second {
				last = time.Now()
				mu.Lock()
				n := len(noisy.latencies)
				mu.Unlock()
				progress("%s: %5.1fs  noisy %d/%d answered, effective limit %d",
					name, time.Since(start).Seconds(), n, cpuNoisyN, p.TenantStat("noisy").EffectiveLimit)
			}
		}
	}()
	quiet = cpuReads(ctx, p, 0, done)
	return noisy, quiet, <-watched
}
