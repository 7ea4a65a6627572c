package tenantdb_test

import (
	"context"
	"fmt"
	"math"
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
		tenantdbtest.WithInitScripts("../../../testdata/cpu_bound.sql"),
		tenantdbtest.WithSetting("max_parallel_workers_per_gather", "0"),
		tenantdbtest.WithSetting("jit", "off"))
}

// cpuPool is a tenantdb.Pool of 20 connections, all open and used once,
// whose tenants have the plan's cap of perTenantCap (queueing their bursts),
// but for the noisy tenant, capped at noisyCap.
func cpuPool(t *testing.T, pg *tenantdbtest.Postgres, noisyCap int, adaptive bool) *tenantdb.Pool {
	t.Helper()
	cfg := pgxConfig(t, pg, sharedConns)
	cfg.MinConns = sharedConns
	p, err := tenantdb.New(context.Background(), cfg, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"standard": {MaxConns: perTenantCap, MaxWaiting: tenantdb.Unbounded}},
		Lookup: func(_ context.Context, id string) (tenantdb.Tenant, error) {
			if id == "noisy" {
				return tenantdb.Tenant{Plan: "standard", MaxConns: noisyCap}, nil
			}
			return tenantdb.Tenant{Plan: "standard"}, nil
		},
		// With adaptive limits every tenant has them: the quiet one too,
		// whose reads are short, so it rarely has more than one or two at once.
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
	// quietMedLimit is the quiet tenant's median effective limit (0 before
	// its first request).
	quietMedLimit int
	active        int // most noisy backends active at once
	// stall is the share of the burst this process could not run (see
	// tenantdbtest.StallProbe), and stallWorst its longest stall.
	stall      float64
	stallWorst time.Duration
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
	probe := tenantdbtest.StartStallProbe()
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
	limits := make(chan [2][]int, 1)
	go func() { // the effective limits over the burst, a reading every 10 ms
		var ls [2][]int
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			ls[0] = append(ls[0], p.TenantStat("noisy").EffectiveLimit)
			ls[1] = append(ls[1], p.TenantStat("quiet").EffectiveLimit)
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
	for _, l := range ls {
		slices.Sort(l)
	}
	r.medLimit, r.quietMedLimit = ls[0][len(ls[0])/2], ls[1][len(ls[1])/2]
	if sampler != nil {
		r.active = sampler.stop()
	}
	r.maxLimit = int(maxLimit.Load())
	r.stall, r.stallWorst = probe.Share(), probe.Stop()
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

// cpuRun is one burst under one limit configuration, with the quiet
// tenant's unloaded latency measured on the same pool just before it.
type cpuRun struct {
	unloadedP50 time.Duration
	p50, p99    time.Duration // the quiet tenant's, under the burst
	burstResult
}

func runCPUBurst(t *testing.T, pg *tenantdbtest.Postgres, n, noisyCap int, adaptive bool) cpuRun {
	t.Helper()
	p := cpuPool(t, pg, noisyCap, adaptive)
	unloaded := lookupLoop(t, p, unloadedLookups, 0, nil)
	r := burst(t, p, n, 0, false, func(ctx context.Context, i int) error {
		_, err := p.Exec(ctx, cpuNoisySQL, fmt.Sprint(i))
		return err
	})
	assertNothingHeld(t, p)
	p.Close()
	return cpuRun{unloadedP50: percentile(unloaded, 0.5),
		p50: percentile(r.quiet, 0.5), p99: percentile(r.quiet, 0.99), burstResult: r}
}

// scanAlone is the time of one noisy scan with nothing else running, the
// fastest of three.
func scanAlone(t *testing.T, pg *tenantdbtest.Postgres) time.Duration {
	t.Helper()
	p := cpuPool(t, pg, perTenantCap, false)
	defer p.Close()
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
	return alone
}

// cpuStaticCaps are the static caps an adaptive limit is judged against:
// the best of them in hindsight, on the same workload in the same round, is
// the oracle. The last is the plan's cap, the adaptive limit's ceiling.
var cpuStaticCaps = []int{1, 2, 4, perTenantCap}

// cpuRound is one round: every static cap and the adaptive limit, one burst
// each, in a rotated order.
type cpuRound struct {
	static    []cpuRun // by cpuStaticCaps
	adaptive  cpuRun
	scanAlone time.Duration // before the round
	n         int           // noisy scans in each burst
	// outside is the share of the round's time in which work from outside
	// ran on the database's core (outsideShare), if outsideKnown.
	outside      float64
	outsideKnown bool
}

// burstSize is how many noisy scans a burst sends: about cpuBurstWork of
// one core's time, so that a round takes about as long on a slow machine
// as on a fast one, within [10, cpuNoisyQueries].
func burstSize(scanAlone time.Duration) int {
	return max(10, min(cpuNoisyQueries, int(cpuBurstWork/max(scanAlone, time.Millisecond))))
}

const cpuBurstWork = 3 * time.Second

// best is the oracle of one metric: the lowest any static cap reached.
func (r cpuRound) best(metric func(cpuRun) time.Duration) time.Duration {
	b := metric(r.static[0])
	for _, s := range r.static[1:] {
		b = min(b, metric(s))
	}
	return b
}

// ratio is the adaptive limit's metric over the oracle's.
func (r cpuRound) ratio(metric func(cpuRun) time.Duration) float64 {
	return float64(metric(r.adaptive)) / float64(r.best(metric))
}

// disturbed says whether the round's own probes show that something outside
// shared the database's core: one scan at a time keeps the core busy, so the
// fastest static burst took much longer than its scans' CPU time only if
// someone else ran there; and the quiet tenant alone should read about as
// fast before every burst of a round. Where the core's own accounts could be
// read, they tell directly: work of neither the database nor the test ran
// there for more than coreShared of the round.
func (r cpuRound) disturbed(floor time.Duration) bool {
	if r.outsideKnown && r.outside > coreShared {
		return true
	}
	cpuTime := time.Duration(r.n) * r.scanAlone
	lo, hi := r.adaptive.unloadedP50, r.adaptive.unloadedP50
	for _, s := range r.static {
		lo, hi = min(lo, s.unloadedP50), max(hi, s.unloadedP50)
	}
	return float64(r.best(makespanOf)) > 1.35*float64(cpuTime) || float64(hi) > 1.5*float64(lo) || hi > 2*floor
}

func p50Of(r cpuRun) time.Duration      { return r.p50 }
func p99Of(r cpuRun) time.Duration      { return r.p99 }
func makespanOf(r cpuRun) time.Duration { return r.makespan }

// medianOf is the median of xs (the lower middle of an even count).
func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// TestAdaptiveLimitsIsolateCPUBoundLoad judges adaptive limits by the
// hindsight-best static cap on the same CPU-bound workload: in each round a
// burst of noisy scans runs under static caps 1, 2, 4 and the plan's cap 10,
// and under adaptive limits (cap 10), in a rotated order, while the quiet
// tenant reads; a fresh pool each time, so the adaptive limit's cold start
// is in its numbers. Which static cap is best depends on the database's
// cores and the machine's speed; the ratio to it does not.
//
// Targets, the medians over rounds of each round's ratio to its best static
// cap: the quiet tenant's p50 and p99 and the noisy burst's makespan within
// cpuTargets' margins, and the adaptive limit held down (median effective
// limit at most 3 of the cap 10). The mechanism must show, or the test
// fails whatever the machine (see mechanism): the plan's cap visibly worse
// than the best static cap, or the workload proves nothing, and the
// adaptive limit below the cap.
//
// The rounds run on one shared core, which other work on the machine can
// swamp; interleaving spreads that over every configuration, and a median
// over rounds drops one disturbed round. If the targets are missed after
// three rounds, up to two more run within cpuBudget. If they are still
// missed, the test fails, unless most rounds' own probes showed a
// disturbance from outside (see cpuRound.disturbed): then it skips, saying
// so. The mechanism is judged with the targets and fails the test whatever
// the targets.
func TestAdaptiveLimitsIsolateCPUBoundLoad(t *testing.T) {
	pg := startCPUPostgres(t)
	var (
		rounds    []cpuRound
		floor     time.Duration // the lowest unloaded median seen
		disturbed int
		dist      []bool // by round
		missed    []string
	)
	start := time.Now()
	for i := 0; i < 5; i++ {
		if i > 0 && time.Since(start) > cpuBudget {
			t.Logf("%d rounds took %v, over the budget of %v: judging those", i, time.Since(start).Round(time.Second), cpuBudget)
			break
		}
		before := sampleCore(t, pg)
		r := cpuRound{static: make([]cpuRun, len(cpuStaticCaps)), scanAlone: scanAlone(t, pg)}
		r.n = burstSize(r.scanAlone)
		order := len(cpuStaticCaps) + 1 // the adaptive limit is the last index
		for k := range order {
			j := (i + k) % order
			if j == len(cpuStaticCaps) {
				r.adaptive = runCPUBurst(t, pg, r.n, perTenantCap, true)
			} else {
				r.static[j] = runCPUBurst(t, pg, r.n, cpuStaticCaps[j], false)
			}
		}
		for _, s := range append(slices.Clone(r.static), r.adaptive) {
			if floor == 0 || s.unloadedP50 < floor {
				floor = s.unloadedP50
			}
		}
		r.outside, r.outsideKnown = outsideShare(before, sampleCore(t, pg))
		logCPURound(t, i+1, r)
		rounds = append(rounds, r)
		dist = append(dist, r.disturbed(floor))
		if dist[len(dist)-1] {
			disturbed++
		}
		if len(rounds) < 3 && time.Since(start) < cpuBudget {
			continue
		}
		if mechanism(t, rounds, dist); t.Failed() {
			return
		}
		if missed = cpuTargets(rounds); len(missed) == 0 {
			return
		}
		t.Logf("after %d rounds (%d disturbed from outside) missed: %s", len(rounds), disturbed, strings.Join(missed, "; "))
	}
	if mechanism(t, rounds, dist); t.Failed() {
		return
	}
	if missed = cpuTargets(rounds); len(missed) == 0 {
		return
	}
	if 2*disturbed > len(rounds) {
		t.Skipf("%d of %d rounds were disturbed from outside (the core was shared, or the quiet tenant alone moved); "+
			"the targets could not be measured. Misses: %s", disturbed, len(rounds), strings.Join(missed, "; "))
	}
	t.Errorf("the targets were missed over %d rounds, %d of them disturbed:\n%s", len(rounds), disturbed, strings.Join(missed, "\n"))
}

// cpuTargets' margins: how far the adaptive limit may be from the best
// static cap (the median over rounds of the per-round ratio). These are CI
// margins, looser than the goals (DESIGN.md, "Measuring an adaptive
// controller"; the benchmark's oracle-cpu reports against the goals): quiet
// p50 1.35x where the goal is 1.2x, quiet p99 2.0x where the goal is 1.5x,
// noisy makespan 1.35x where the goal is 1.2x. Passing this test therefore
// does not mean the goals are met. The test allows 1.35x on the quiet p50
// and the makespan so that CI does not fail on the trade the controller
// makes by design: it holds the noisy tenant at one or two scans, the best
// cap for the quiet tenant's latency, while the best cap for the noisy
// tenant's makespan is two to four (three clean CI runs measured makespan
// medians of 1.21-1.25x, quiet p50 1.14x). Static cap 10, which the
// mechanism check requires to be at least 1.5x the best, stays far outside
// them (8x here). The p99 margin is wider still, as the quiet tenant's
// slowest reads fall in the adaptive limit's tries above the best cap
// (slow start's first step, and the backoff's), which the best static cap
// never makes.
const (
	cpuTargetP50      = 1.35 // CI margin; the goal is 1.2x
	cpuTargetP99      = 2.0  // CI margin; the goal is 1.5x
	cpuTargetMakespan = 1.35 // CI margin; the goal is 1.2x
)

// cpuBudget bounds the test's time: no round starts after it, and a third
// round only before it. A round takes about 30 s on the developers' machine
// (the bursts are sized to the machine's speed, see burstSize); only
// outside load makes three take longer than this.
const cpuBudget = 6 * time.Minute

func logCPURound(t *testing.T, i int, r cpuRound) {
	t.Helper()
	line := func(name string, s cpuRun) {
		t.Logf("round %d, %-10s quiet alone p50 %v; under load p50 %v (%.2fx alone, %.2fx best static), p99 %v (%.2fx best static); "+
			"noisy scans in %v (%.2fx best static), effective limit median %d, at most %d (quiet's median %d)",
			i, name+":", s.unloadedP50, s.p50, float64(s.p50)/float64(s.unloadedP50), float64(s.p50)/float64(r.best(p50Of)),
			s.p99, float64(s.p99)/float64(r.best(p99Of)), s.makespan.Round(time.Millisecond),
			float64(s.makespan)/float64(r.best(makespanOf)), s.medLimit, s.maxLimit, s.quietMedLimit)
	}
	t.Logf("round %d: one scan alone %v; %d scans a burst; work from outside on the database's core %.0f%% of the round (measured: %v)",
		i, r.scanAlone.Round(time.Millisecond), r.n, 100*r.outside, r.outsideKnown)
	for j, c := range cpuStaticCaps {
		line(fmt.Sprintf("static %d", c), r.static[j])
	}
	line("adaptive", r.adaptive)
}

// mechanism fails the test if the rounds do not show what the targets are
// about. The adaptive limit must be held below the cap (the median over
// rounds of its median effective limit): even with other work sharing the
// core, ten scans at once inflate a scan's time enough to be cut; how far
// down it is held is a target (cpuTargets), as outside load on the core
// rightly lets it hold more. And in the rounds that no outside load
// disturbed, the plan's cap must be visibly worse than the best static cap
// (median quiet p50 at least 1.5x the best's), or the noisy tenant does
// not load the core enough to prove anything; a disturbed round cannot
// tell (the quiet tenant's own reads pile up whatever the cap).
func mechanism(t *testing.T, rounds []cpuRound, disturbed []bool) {
	t.Helper()
	var planRatios, limits []float64
	for i, r := range rounds {
		plan := r.static[len(cpuStaticCaps)-1]
		if !disturbed[i] {
			planRatios = append(planRatios, float64(plan.p50)/float64(r.best(p50Of)))
		}
		limits = append(limits, float64(r.adaptive.medLimit))
		if plan.medLimit != perTenantCap {
			t.Errorf("static cap %d: effective limit median %d", perTenantCap, plan.medLimit)
		}
	}
	if len(planRatios) > 0 {
		if med := medianOf(planRatios); med < 1.5 {
			t.Errorf("static cap %d: quiet p50 only %.2fx the best static cap's (median of %.2f over the undisturbed rounds): "+
				"the noisy tenant does not load the core enough to prove anything", perTenantCap, med, planRatios)
		}
	}
	if med := medianOf(limits); med >= perTenantCap {
		t.Errorf("adaptive: effective limit medians %v, at the cap %d: the controller does not hold a CPU-bound tenant down", limits, perTenantCap)
	}
}

// cpuTargets returns the targets the rounds missed, each judged by the
// median over rounds of its ratio to the round's best static cap.
func cpuTargets(rounds []cpuRound) []string {
	var missed []string
	var limits []float64
	for _, r := range rounds {
		limits = append(limits, float64(r.adaptive.medLimit))
	}
	if med := medianOf(limits); med > 3 {
		missed = append(missed, fmt.Sprintf("adaptive: effective limit medians %v, want at most 3 of the cap %d", limits, perTenantCap))
	}
	for _, m := range []struct {
		name         string
		metric       func(cpuRun) time.Duration
		target, goal float64
	}{{"quiet p50", p50Of, cpuTargetP50, 1.2}, {"quiet p99", p99Of, cpuTargetP99, 1.5}, {"noisy makespan", makespanOf, cpuTargetMakespan, 1.2}} {
		var ratios []float64
		for _, r := range rounds {
			ratios = append(ratios, r.ratio(m.metric))
		}
		if med := medianOf(ratios); med > m.target {
			missed = append(missed, fmt.Sprintf("adaptive %s %.2fx the best static cap's (median of %.2f), want at most %.2fx (CI's margin; the goal is %.1fx)",
				m.name, med, ratios, m.target, m.goal))
		}
	}
	return missed
}

// outsideInflation is how much longer than their sleep the static cap's quiet
// reads may take before a round counts as disturbed from outside: the
// adaptive limit's default Tolerance, beyond which it cuts a tenant whose
// holds inflate, whatever inflated them.
const outsideInflation = 1.3

// TestAdaptiveLimitsKeepWaitingWork: a pg_sleep burst does not inflate with
// concurrency, so the adaptive limit climbs to the cap and the burst takes
// about as long as under the static cap, the best static cap for waiting
// work (slow start costs about log2(cap/floor) rounds of the burst's 30);
// and the quiet tenant (reads of 30 ms every 5 ms) is served as under the
// static cap. Both are measured against the static cap in the same round,
// in up to three rounds of alternating order; each target must hold in one
// of them, so that outside load in one burst does not decide, while a
// mechanism that is missing fails them all.
//
// Its margins are CI's, looser than the goals (DESIGN.md, "Measuring an
// adaptive controller"), and passing it does not mean they are met: the
// makespan within 1.15x of static cap 10's, the better of two rounds, where
// the goal for a pure-wait flood is 1.1x of its ideal (the benchmark's
// oracle-flood judges that); the quiet p50 within 1.5x of static cap 10's,
// the better of two rounds, where the goal is 1.2x of the best static cap's.
// Slow start from the floor 1 (1, 2, 4, 8, then 10) serves 15 requests in
// its first 4 rounds where the cap serves 40, so this burst of 30 rounds
// needs at least 33 (1.10x) and a burst of 10 rounds at least 13 (1.30x).
//
// A round in which the static cap's own quiet reads took longer than
// outsideInflation times their sleep was disturbed from outside (a starved
// machine makes every hold longer, which the adaptive limit takes for
// queueing: see docs/adaptive-limits.md) and is not judged; with every round
// disturbed the test is skipped with the reason. So is a round in which this
// process could not run for more than outsideInflation-1 of the adaptive
// run (tenantdbtest.StallProbe): a starved client inflates the holds it
// measures by as much, and the adaptive limit cuts on them; the static
// reference, which measures nothing, does not show it.
func TestAdaptiveLimitsKeepWaitingWork(t *testing.T) {
	const n, sleep = 300, 100 * time.Millisecond
	run := func(adaptive bool) burstResult {
		p := cpuPool(t, sharedPG, perTenantCap, adaptive)
		lookupLoop(t, p, 20, quietSleep, nil) // the quiet tenant is not cold when the burst starts
		r := burst(t, p, n, quietSleep, true, func(ctx context.Context, i int) error {
			_, err := p.Exec(ctx, "select pg_sleep($1::float8) /* tenant=noisy */", sleep.Seconds())
			return err
		})
		assertNothingHeld(t, p)
		return r
	}
	ideal := time.Duration(n/perTenantCap) * sleep
	bestMakespan, bestQuiet := math.Inf(1), math.Inf(1)
	judged := 0
	for round := 0; round < 3 && (bestMakespan > 1.15 || bestQuiet > 1.5); round++ {
		var static, adaptive burstResult
		if round%2 == 0 {
			static, adaptive = run(false), run(true)
		} else {
			adaptive, static = run(true), run(false)
		}
		makespan := float64(adaptive.makespan) / float64(static.makespan)
		quiet := float64(percentile(adaptive.quiet, 0.5)) / float64(percentile(static.quiet, 0.5))
		if staticQuiet := percentile(static.quiet, 0.5); float64(staticQuiet) > outsideInflation*float64(quietSleep) {
			t.Logf("round %d: disturbed from outside, not judged: the static cap's quiet reads of %v took %v at the median (adaptive %v, burst %v against static %v)",
				round+1, quietSleep, staticQuiet, percentile(adaptive.quiet, 0.5), adaptive.makespan.Round(time.Millisecond), static.makespan.Round(time.Millisecond))
			continue
		}
		t.Logf("round %d: this process could not run %.1f%% of the static run (longest stall %v) and %.1f%% of the adaptive run (%v)",
			round+1, 100*static.stall, static.stallWorst, 100*adaptive.stall, adaptive.stallWorst)
		if adaptive.stall > outsideInflation-1 {
			t.Logf("round %d: disturbed from outside, not judged: this process could not run for more than %.0f%% of the adaptive run, which alone inflates its holds past the Tolerance",
				round+1, 100*(outsideInflation-1))
			continue
		}
		judged++
		bestMakespan, bestQuiet = min(bestMakespan, makespan), min(bestQuiet, quiet)
		t.Logf("round %d: noisy %d x %v: ideal %v, static %v (%.3fx), adaptive %v (%.3fx the static cap's), at most %d active, "+
			"effective limit up to %d; quiet p50 static %v, adaptive %v (%.2fx; its effective limit median %d)",
			round+1, n, sleep, ideal, static.makespan.Round(time.Millisecond), float64(static.makespan)/float64(ideal),
			adaptive.makespan.Round(time.Millisecond), makespan, adaptive.active, adaptive.maxLimit,
			percentile(static.quiet, 0.5), percentile(adaptive.quiet, 0.5), quiet, adaptive.quietMedLimit)
		if adaptive.maxLimit != perTenantCap {
			t.Errorf("round %d: adaptive: effective limit reached %d, want the cap %d: waiting-type work was throttled", round+1, adaptive.maxLimit, perTenantCap)
		}
	}
	if judged == 0 {
		t.Skip("every round was disturbed from outside: the targets could not be measured")
	}
	if bestMakespan > 1.15 {
		t.Errorf("adaptive: the burst took at best %.3fx as long as under the static cap, want at most 1.15x (CI's margin; the goal is 1.1x of the ideal)", bestMakespan)
	}
	if bestQuiet > 1.5 {
		t.Errorf("adaptive: quiet p50 at best %.2fx the static cap's, want at most 1.5x (CI's margin; the goal is 1.2x)", bestQuiet)
	}
}
