package tenantdb_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// Isolation under CPU-bound load (issue 11). PostgreSQL runs on one CPU; a
// noisy tenant sends scans that compute md5 over 300,000 rows (all CPU),
// many at once; a quiet tenant reads 200 rows by a primary key range (about
// 0.1 ms of CPU). Every query the noisy tenant runs beyond what the core can
// run in parallel only queues inside PostgreSQL, and the quiet tenant's
// reads queue with them. (A single-row lookup needs so little CPU that the
// kernel's scheduler runs it at once at the median: only its p99 suffers.)
const (
	cpuNoisyQueries = 40
	cpuNoisySQL     = "select count(*) from cpu_rows where md5(payload || $1::text) < '1' /* tenant=noisy */"
	cpuQuietSQL     = "select count(*) from cpu_rows where id between $1 and $1 + 199 and md5(payload) < '8' /* tenant=quiet */"
	quietPace       = 5 * time.Millisecond // between the quiet tenant's reads
	unloadedLookups = 300
)

// startCPUPostgres starts PostgreSQL confined to one CPU with the
// cpu_rows table, and no parallel workers or JIT: one query, one backend,
// one core's worth of work.
func startCPUPostgres(t *testing.T) *tenantdbtest.Postgres {
	t.Helper()
	return tenantdbtest.StartPostgres(t,
		tenantdbtest.WithCPUSet("1"),
		tenantdbtest.WithInitScripts("../testdata/cpu_bound.sql"),
		tenantdbtest.WithSetting("max_parallel_workers_per_gather", "0"),
		tenantdbtest.WithSetting("jit", "off"))
}

// cpuPool is a tenantdb.Pool of 20 connections, all open and used once,
// with the noisy tenant capped at perTenantCap and queueing its burst.
func cpuPool(t *testing.T, pg *tenantdbtest.Postgres, cap int, adaptive bool) *tenantdb.Pool {
	t.Helper()
	cfg := pgxConfig(t, pg, sharedConns)
	cfg.MinConns = sharedConns
	p, err := tenantdb.New(context.Background(), cfg, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"standard": {MaxConns: cap, MaxWaiting: tenantdb.Unbounded}},
		// The quiet tenant has the plan too; its reads are short, so it
		// rarely has more than one or two at once.
		Adaptive: tenantdb.Adaptive{Enabled: adaptive},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	eventually(t, "every connection is open", func() bool { return p.Pgxpool().Stat().TotalConns() == sharedConns })
	var wg sync.WaitGroup
	for i := range sharedConns { // touch every connection once
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.Exec(as(fmt.Sprintf("warm-%d", i)), "select 1"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	return p
}

// lookupLoop runs the quiet tenant's queries (reads in cpu_rows, or with
// sleep, pg_sleep for that long) on a fixed schedule, quietPace apart
// whether or not the earlier ones are done (so the quiet tenant asks for the
// same work whatever its latency), until stop is closed or, when n > 0, n
// of them ran. It returns their latencies.
func lookupLoop(t *testing.T, p *tenantdb.Pool, n int, sleep time.Duration, stop <-chan struct{}) []time.Duration {
	rng := rand.New(rand.NewPCG(7, 11))
	sql, arg := cpuQuietSQL, func() any { return 1 + rng.IntN(300_000-200) }
	if sleep > 0 {
		sql, arg = sleepSQL("quiet"), func() any { return sleep.Seconds() }
	}
	var (
		mu sync.Mutex
		ds []time.Duration
		wg sync.WaitGroup
	)
	start := time.Now()
	for i := 0; n <= 0 || i < n; i++ {
		select {
		case <-stop:
			wg.Wait()
			return ds
		default:
		}
		time.Sleep(time.Until(start.Add(time.Duration(i) * quietPace))) // the schedule, not synchronisation
		wg.Add(1)
		go func(a any) {
			defer wg.Done()
			t0 := time.Now()
			if _, err := p.Exec(as("quiet"), sql, a); err != nil {
				t.Errorf("quiet: %v", err)
				return
			}
			mu.Lock()
			ds = append(ds, time.Since(t0))
			mu.Unlock()
		}(arg())
	}
	wg.Wait()
	return ds
}

type burstResult struct {
	quiet    []time.Duration
	makespan time.Duration // of the noisy burst
	maxLimit int           // the noisy tenant's highest effective limit seen
	medLimit int           // its median effective limit, sampled every 10 ms
	active   int           // most noisy backends active at once
}

// burst sends n noisy queries at once and runs the quiet lookups until they
// are all done. With sample (on sharedPG only) it counts the noisy tenant's
// active backends; on the one-CPU server the sampler would be load itself.
func burst(t *testing.T, p *tenantdb.Pool, n int, quietSleep time.Duration, sample bool, noisy func(ctx context.Context, i int) error) burstResult {
	t.Helper()
	var sampler *activitySampler
	if sample {
		sampler = startActivitySampler(t, "tenant=noisy ")
	}
	var r burstResult
	var maxLimit atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := noisy(as("noisy"), i); err != nil {
				t.Errorf("noisy: %v", err)
			}
			if l := int64(p.TenantStat("noisy").EffectiveLimit); l > maxLimit.Load() {
				maxLimit.Store(l) // racy max: good enough for a report
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		r.makespan = time.Since(start)
		close(done)
	}()
	limits := make(chan []int, 1)
	go func() { // the effective limit over the burst, a reading every 10 ms
		var ls []int
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			ls = append(ls, p.TenantStat("noisy").EffectiveLimit)
			select {
			case <-done:
				limits <- ls
				return
			case <-tick.C:
			}
		}
	}()
	r.quiet = lookupLoop(t, p, 0, quietSleep, done)
	<-done
	ls := <-limits
	slices.Sort(ls)
	r.medLimit = ls[len(ls)/2]
	if sampler != nil {
		r.active = sampler.stop()
	}
	r.maxLimit = int(maxLimit.Load())
	return r
}

func percentile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

type cpuScenario struct {
	unloadedP50       time.Duration // before the burst
	afterP50          time.Duration // the same, after it
	scanAlone         time.Duration // one noisy scan alone, the fastest of three
	p50Ratio, p99Over float64       // quiet p50 / unloaded p50, quiet p99 / unloaded p50
	burstResult
}

func runCPUScenario(t *testing.T, pg *tenantdbtest.Postgres, cap int, adaptive bool) cpuScenario {
	t.Helper()
	p := cpuPool(t, pg, cap, adaptive)
	var alone time.Duration
	for i := range 3 {
		start := time.Now()
		if _, err := p.Exec(as("probe"), cpuNoisySQL, fmt.Sprint("probe", i)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); alone == 0 || d < alone {
			alone = d
		}
	}
	unloaded := lookupLoop(t, p, unloadedLookups, 0, nil)
	r := burst(t, p, cpuNoisyQueries, 0, false, func(ctx context.Context, i int) error {
		_, err := p.Exec(ctx, cpuNoisySQL, fmt.Sprint(i))
		return err
	})
	after := lookupLoop(t, p, unloadedLookups/3, 0, nil)
	assertNothingHeld(t, p)
	p.Close()
	u := percentile(unloaded, 0.5)
	return cpuScenario{unloadedP50: u, afterP50: percentile(after, 0.5), scanAlone: alone,
		p50Ratio:    float64(percentile(r.quiet, 0.5)) / float64(u),
		p99Over:     float64(percentile(r.quiet, 0.99)) / float64(u),
		burstResult: r}
}

// TestAdaptiveLimitsIsolateCPUBoundLoad runs the burst under the static cap
// and then with adaptive limits, and compares the quiet tenant's latencies
// with its own unloaded ones from the same attempt.
//
// An attempt must show the mechanism (under adaptive limits the noisy
// tenant's effective limit held near the floor, its median at most 3; under
// the static cap 10) and meet the targets: quiet p50 at most 1.5x unloaded,
// the scans within 1.3x of the static cap's time, the static cap visibly
// worse (p50 at least 2x unloaded, p99 at least 1.5x adaptive's). All are measured on one shared core,
// which other work on the machine (other packages' tests, other jobs) can
// swamp: under heavy outside load a tenant's own concurrency no longer
// decides its latency, and more of it even buys CPU share, so the controller
// rightly holds it less. Two probes tell a disturbed attempt: each scenario
// times one noisy scan alone (the fastest of three) and the quiet tenant
// alone before and after its burst. An attempt is disturbed when a burst
// took more than 1.35x the CPU time of its scans (one scan at a time keeps
// the core busy, so only someone else can stretch it), or its unloaded
// medians disagree by more than 1.5x, or lie above twice the lowest seen.
// Up to three attempts run until one passes; if none does, the test fails,
// unless every attempt was disturbed: then it skips, saying so.
func TestAdaptiveLimitsIsolateCPUBoundLoad(t *testing.T) {
	pg := startCPUPostgres(t)
	var floor time.Duration // the lowest unloaded median seen
	var missed []string
	disturbedAll := true
	for attempt := 1; attempt <= 3; attempt++ {
		static := runCPUScenario(t, pg, perTenantCap, false)
		adaptive := runCPUScenario(t, pg, perTenantCap, true)
		for _, s := range []struct {
			name string
			cpuScenario
		}{{"static cap 10", static}, {"adaptive", adaptive}} {
			t.Logf("attempt %d, %s: quiet alone p50 %v before, %v after; under load p50 %.2fx, p99 %.1fx unloaded p50 (%d reads); "+
				"noisy %d queries in %v (one alone: %v), effective limit median %d, at most %d",
				attempt, s.name, s.unloadedP50, s.afterP50, s.p50Ratio, s.p99Over, len(s.quiet), cpuNoisyQueries,
				s.makespan.Round(time.Millisecond), s.scanAlone.Round(time.Millisecond), s.medLimit, s.maxLimit)
			for _, d := range []time.Duration{s.unloadedP50, s.afterP50} {
				if floor == 0 || d < floor {
					floor = d
				}
			}
		}
		disturbed := false
		for _, s := range []cpuScenario{static, adaptive} {
			lo, hi := min(s.unloadedP50, s.afterP50), max(s.unloadedP50, s.afterP50)
			// The scans keep the core busy whatever the limit (one at a
			// time saturates it), so a burst that takes much longer than
			// its scans' CPU time shared the core with someone else.
			cpuTime := time.Duration(cpuNoisyQueries) * min(static.scanAlone, adaptive.scanAlone)
			disturbed = disturbed || float64(hi) > 1.5*float64(lo) || hi > 2*floor ||
				float64(s.makespan) > 1.35*float64(cpuTime)
		}
		missed = cpuTargets(static, adaptive)
		if len(missed) == 0 {
			return
		}
		disturbedAll = disturbedAll && disturbed
		t.Logf("attempt %d (disturbed from outside: %v) missed: %s", attempt, disturbed, strings.Join(missed, "; "))
	}
	if disturbedAll {
		t.Skipf("every attempt was disturbed from outside (the core was shared, or the quiet tenant alone moved); "+
			"the targets could not be measured. Last misses: %s", strings.Join(missed, "; "))
	}
	t.Errorf("no attempt met the targets, and not every one was disturbed. Last misses:\n%s", strings.Join(missed, "\n"))
}

// cpuTargets returns the targets one attempt missed.
func cpuTargets(static, adaptive cpuScenario) []string {
	var missed []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			missed = append(missed, fmt.Sprintf(format, args...))
		}
	}
	check(static.medLimit == perTenantCap && adaptive.medLimit <= 3,
		"effective limit medians: static %d (want %d), adaptive %d (want at most 3): the controller does not hold a CPU-bound tenant down",
		static.medLimit, perTenantCap, adaptive.medLimit)
	// The static cap must be visibly worse, or the test could not fail; at
	// p99 that is the assertion (adaptive at most 2/3 of the static cap's):
	// the absolute p99 target (20x the unloaded p50) is for the
	// benchmark, as the p99 of reads on one shared core swings with outside
	// load far more than the median does (50x to 500x at load average 14).
	check(static.p50Ratio >= 2 && static.p99Over >= 1.5*adaptive.p99Over,
		"static cap 10: quiet p50 %.2fx unloaded, p99 %.1fx (adaptive %.1fx): the noisy tenant does not load the core enough to prove anything",
		static.p50Ratio, static.p99Over, adaptive.p99Over)
	check(adaptive.p50Ratio <= 1.5, "adaptive: quiet p50 %.2fx unloaded, want at most 1.5x", adaptive.p50Ratio)
	ratio := float64(adaptive.makespan) / float64(static.makespan)
	check(ratio <= 1.3, "adaptive: noisy took %.2fx as long as under the static cap, want at most 1.3x", ratio)
	return missed
}

// TestAdaptiveLimitsKeepWaitingWork: a pg_sleep burst does not inflate with
// concurrency, so the adaptive limit climbs to the cap and the burst takes
// about as long as under the static cap (slow start costs about
// log2(cap/floor) rounds of the burst's 30); and the quiet tenant stays isolated.
func TestAdaptiveLimitsKeepWaitingWork(t *testing.T) {
	const n, sleep = 300, 100 * time.Millisecond
	run := func(adaptive bool) (burstResult, time.Duration) {
		p := cpuPool(t, sharedPG, perTenantCap, adaptive)
		unloaded := percentile(lookupLoop(t, p, 20, quietSleep, nil), 0.5)
		r := burst(t, p, n, quietSleep, true, func(ctx context.Context, i int) error {
			_, err := p.Exec(ctx, "select pg_sleep($1::float8) /* tenant=noisy */", sleep.Seconds())
			return err
		})
		assertNothingHeld(t, p)
		return r, unloaded
	}
	static, _ := run(false)
	adaptive, unloaded := run(true)
	ideal := time.Duration(n/perTenantCap) * sleep
	t.Logf("noisy %d x %v: ideal %v, static %v (%.3fx), adaptive %v (%.3fx), at most %d active, effective limit up to %d; quiet p50 %.2fx unloaded",
		n, sleep, ideal, static.makespan.Round(time.Millisecond), float64(static.makespan)/float64(ideal),
		adaptive.makespan.Round(time.Millisecond), float64(adaptive.makespan)/float64(ideal), adaptive.active, adaptive.maxLimit,
		float64(percentile(adaptive.quiet, 0.5))/float64(unloaded))
	if adaptive.maxLimit != perTenantCap {
		t.Errorf("adaptive: effective limit reached %d, want the cap %d: waiting-type work was throttled", adaptive.maxLimit, perTenantCap)
	}
	if ratio := float64(adaptive.makespan) / float64(static.makespan); ratio > 1.15 {
		t.Errorf("adaptive: the burst took %.3fx as long as under the static cap, want at most 1.15x", ratio)
	}
	if ratio := float64(percentile(adaptive.quiet, 0.5)) / float64(unloaded); ratio > 1.5 {
		t.Errorf("adaptive: quiet p50 %.2fx unloaded, want at most 1.5x", ratio)
	}
}
