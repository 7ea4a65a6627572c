package pool

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// workload says how long each of n permits held at once is held.
type workload func(n int) time.Duration

// cpuBound is work on one core shared by all it runs: n at once take n times
// as long (processor sharing), which is what queueing inside the database
// looks like from outside.
func cpuBound(base time.Duration) workload {
	return func(n int) time.Duration { return time.Duration(n) * base }
}

// waitingType is work that waits (a sleep, a lock held elsewhere, a remote
// call): it takes as long however many run at once.
func waitingType(base time.Duration) workload {
	return func(int) time.Duration { return base }
}

// simulate runs a tenant that always has work waiting through a controller,
// in rounds: every round the controller's limit is granted at once, held as
// long as w says for that many, and released in turn. It returns the limit
// after each round and the clock at the end.
func simulate(a *adaptiveLimit, cfg Adaptive, floor, cap, rounds int, now int64, w workload) ([]int, int64) {
	var limits []int
	for range rounds {
		n := a.limit
		start := now
		for i := range n {
			a.granted(i + 1)
			a.held(now)
		}
		hold := int64(w(n))
		now += hold
		for i := range n {
			a.observe(start, hold, now, n-1-i, &cfg, floor, cap)
		}
		limits = append(limits, a.limit)
	}
	return limits, now
}

type acquired struct {
	p   Permit
	err error
}

func acquireAsync(ctx context.Context, g *Gate, id string) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		p, err := g.Acquire(ctx, id)
		ch <- acquired{p, err}
	}()
	return ch
}

// simulateClosedLoop runs a tenant that always has work waiting, as the
// Gate does: each release is fed to the controller, then freed slots are
// granted at once, so rounds overlap. Each permit is held as long as w says
// for the permits held when it was granted. It returns the limit at every
// multiple of step, up to d.
func simulateClosedLoop(a *adaptiveLimit, cfg Adaptive, floor, cap int, d, step time.Duration, w workload) []int {
	type permit struct{ start, end int64 }
	var held []permit
	now := int64(1)
	grant := func() {
		for len(held) < a.limit {
			a.granted(len(held) + 1)
			a.held(now)
			held = append(held, permit{start: now, end: now + int64(w(len(held)+1))})
		}
	}
	grant()
	var limits []int
	next := int64(step)
	for now < int64(d) {
		i := 0
		for j := range held {
			if held[j].end < held[i].end {
				i = j
			}
		}
		p := held[i]
		for next <= p.end && next <= int64(d) {
			limits = append(limits, a.limit)
			next += int64(step)
		}
		now = p.end
		held = append(held[:i], held[i+1:]...)
		a.observe(p.start, p.end-p.start, now, len(held), &cfg, floor, cap)
		grant()
	}
	return limits
}

// simulateOneCore runs a tenant that always has work waiting, as the Gate
// does, against one core shared by every permit held (processor sharing):
// each permit needs work of CPU time, and n held at once each progress at
// 1/n of the core. It returns the limit at every multiple of step, up to d.
func simulateOneCore(a *adaptiveLimit, cfg Adaptive, floor, cap int, d, step, work time.Duration) []int {
	type permit struct{ start, left int64 }
	var held []permit
	now := int64(1)
	var limits []int
	next := int64(step)
	for now < int64(d) {
		for len(held) < a.limit {
			a.granted(len(held) + 1)
			a.held(now)
			held = append(held, permit{start: now, left: int64(work)})
		}
		i := 0
		for j := range held {
			if held[j].left < held[i].left {
				i = j
			}
		}
		n := int64(len(held))
		end := now + held[i].left*n
		for next <= end && next <= int64(d) {
			limits = append(limits, a.limit)
			next += int64(step)
		}
		done := held[i].left
		for j := range held {
			held[j].left -= done
		}
		now = end
		p := held[i]
		held = append(held[:i], held[i+1:]...)
		a.observe(p.start, now-p.start, now, len(held), &cfg, floor, cap)
	}
	return limits
}

func TestAdaptiveLimitClosedLoopSlowStartDoublesEveryRound(t *testing.T) {
	cfg := adaptiveDefaults(t)
	a := newAdaptiveLimit(2, 1)
	// Permits released one at a time, each replaced at once.
	limits := simulateClosedLoop(a, cfg, 2, 10, 10*time.Second, 500*time.Millisecond, waitingType(time.Second))
	// At 0.5 s: 2; at 1.5 s: 4; at 2.5 s: 8; from 3 s on: the cap.
	if limits[0] != 2 || limits[2] != 4 || limits[4] != 8 || limits[6] != 10 || limits[len(limits)-1] != 10 {
		t.Fatalf("limits every 0.5 s: %v, want 2 4 8 then 10 a round apart", limits)
	}
}

func TestAdaptiveLimitClosedLoopCPUBound(t *testing.T) {
	cfg := adaptiveDefaults(t)
	a := newAdaptiveLimit(2, 1)
	limits := simulateClosedLoop(a, cfg, 2, 10, 60*time.Second, time.Second, cpuBound(300*time.Millisecond))
	for i, l := range limits[5:] {
		if l > 3 {
			t.Fatalf("at %d s: limit %d, want at most 3 once settled; %v", i+5, l, limits)
		}
	}
}

func adaptiveDefaults(t *testing.T) Adaptive {
	t.Helper()
	cfg, err := Adaptive{Enabled: true}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestAdaptiveLimitCPUBoundSettlesNearTheFloor(t *testing.T) {
	cfg := adaptiveDefaults(t)
	a := newAdaptiveLimit(2, 1)
	limits, _ := simulate(a, cfg, 2, 10, 40, 1, cpuBound(300*time.Millisecond))
	// The first round, two at once, sets the baseline at 600 ms; 3 at once
	// take 900 ms, 1.5 times that: cut. It must never run away to the cap.
	for i, l := range limits[5:] {
		if l > 3 {
			t.Fatalf("round %d: limit %d, want at most 3 once settled; limits %v", i+5, l, limits)
		}
	}
	if a.slowStart {
		t.Errorf("still in slow start after cuts: %v", limits)
	}
}

func TestAdaptiveLimitWaitingTypeReachesTheCapInSlowStart(t *testing.T) {
	cfg := adaptiveDefaults(t)
	a := newAdaptiveLimit(2, 1)
	limits, _ := simulate(a, cfg, 2, 10, 20, 1, waitingType(time.Second))
	// 2 → 4 → 8 → 10: three rounds, as TCP's slow start doubles per round trip.
	if limits[2] != 10 {
		t.Fatalf("limit after 3 rounds = %d, want the cap 10; limits %v", limits[2], limits)
	}
	for i, l := range limits[2:] {
		if l != 10 {
			t.Fatalf("round %d: limit %d fell below the cap with no inflation; %v", i+2, l, limits)
		}
	}
}

func TestAdaptiveLimitIgnoresSubMillisecondJitter(t *testing.T) {
	cfg := adaptiveDefaults(t)
	a := newAdaptiveLimit(2, 1)
	rng := rand.New(rand.NewPCG(1, 2))
	jittery := func(int) time.Duration { return 100*time.Microsecond + time.Duration(rng.IntN(700))*time.Microsecond }
	limits, _ := simulate(a, cfg, 2, 20, 60, 1, jittery)
	if last := limits[len(limits)-1]; last != 20 {
		t.Fatalf("limit %d, want the cap 20: holds of 0.1 to 0.8 ms vary, they do not queue; %v", last, limits)
	}
}

func TestAdaptiveLimitDoesNotGrowUnused(t *testing.T) {
	cfg := adaptiveDefaults(t)
	a := newAdaptiveLimit(2, 1)
	now := int64(1)
	for range 100 { // one request at a time
		a.granted(1)
		now += int64(10 * time.Millisecond)
		a.observe(now-int64(10*time.Millisecond), int64(10*time.Millisecond), now, 0, &cfg, 2, 10)
	}
	if a.limit != 2 {
		t.Fatalf("limit %d after 100 requests one at a time, want the floor 2: a limit not used tells nothing", a.limit)
	}
}

func TestAdaptiveLimitProbeFollowsDriftUpwards(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = 10 * time.Second
	a := newAdaptiveLimit(2, 1)
	limits, now := simulate(a, cfg, 2, 10, 10, 1, waitingType(100*time.Millisecond))
	if limits[len(limits)-1] != 10 {
		t.Fatalf("did not reach the cap before the drift: %v", limits)
	}
	// Everything now takes five times as long, however much runs: that is
	// not queueing, but with holds grown as much as the limit over the one
	// the baseline was measured at (2 to 10) it looks like it until the
	// baseline is measured again.
	limits, now = simulate(a, cfg, 2, 10, 3, now, waitingType(500*time.Millisecond))
	if limits[len(limits)-1] != 2 {
		t.Fatalf("a fivefold hold time did not cut to the floor: %v", limits)
	}
	limits, _ = simulate(a, cfg, 2, 10, 50, now, waitingType(500*time.Millisecond))
	if last := limits[len(limits)-1]; last != 10 || a.baseline != int64(500*time.Millisecond) {
		t.Fatalf("after a probe: limit %d (want 10), baseline %v (want 500ms); %v", last, time.Duration(a.baseline), limits)
	}
}

func TestAdaptiveLimitBusyTenantIsProbed(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = 5 * time.Second
	a := newAdaptiveLimit(2, 1)
	limits, _ := simulate(a, cfg, 2, 10, 30, 1, waitingType(time.Second))
	probes := 0
	for i := 1; i < len(limits); i++ {
		if limits[i] == 2 && limits[i-1] == 10 {
			probes++
		}
	}
	if probes < 2 {
		t.Fatalf("%d probes in 30 s at the cap with ProbeInterval 5s, want at least 2; %v", probes, limits)
	}
}

func TestAdaptiveLimitBound(t *testing.T) {
	a := newAdaptiveLimit(2, 1)
	a.limit = 8
	if got := a.bound(2, 5); got != 5 {
		t.Errorf("bound under a lowered cap = %d, want 5", got)
	}
	if got := a.bound(6, 10); got != 6 {
		t.Errorf("bound under a raised floor = %d, want 6", got)
	}
	if got := a.bound(4, 3); got != 3 {
		t.Errorf("floor above the cap: bound = %d, want the cap 3", got)
	}
}

func TestAdaptiveConfigValidation(t *testing.T) {
	for _, a := range []Adaptive{
		{Enabled: true, MinConns: -1},
		{Enabled: true, Tolerance: 1},
		{Enabled: true, Tolerance: -2},
		{Enabled: true, Tolerance: 101},
		{Enabled: true, Tolerance: math.NaN()},
		{Enabled: true, Tolerance: math.Inf(1)},
		{Enabled: true, ProbeInterval: -time.Second},
	} {
		if _, err := New(Config{Capacity: 4, Adaptive: a}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: err = %v, want ErrInvalidConfig", a, err)
		}
	}
	if _, err := New(Config{Capacity: 4, Adaptive: Adaptive{MinConns: -1}}); err != nil {
		t.Errorf("disabled Adaptive is not validated, got %v", err)
	}
}

// TestAdaptiveGate drives a Gate with a fake clock: the effective limit
// starts at the floor, doubles when used without inflation, and a cut
// revokes nothing, sends a request holding a slot above it back to wait for
// the cap, and new grants wait until the tenant is below it.
func TestAdaptiveGate(t *testing.T) {
	violations := countViolations(t)
	g, clock := newTestGate(t, Config{Capacity: 10, MaxReserved: 1,
		Plans:    map[string]Plan{"p": {MaxConns: 8, MaxWaiting: Unbounded}},
		Adaptive: Adaptive{Enabled: true, MinConns: 2}})
	ctx := context.Background()
	eff := func() int {
		s, _ := g.TenantStat("a")
		return s.EffectiveLimit
	}
	p1, p2 := acquire(t, g, "a"), acquire(t, g, "a")
	if s, _ := g.TenantStat("a"); s.Limit != 8 || s.EffectiveLimit != 2 {
		t.Fatalf("cold tenant: Limit %d EffectiveLimit %d, want 8 and the floor 2", s.Limit, s.EffectiveLimit)
	}
	next := acquireAsync(ctx, g, "a") // waits, so the tenant does not empty (see emptied)
	waitUntil(t, "a third waits at the floor", func() bool { return g.Stat().Waiting == 1 })
	clock.advance(10 * time.Millisecond)
	p1.Release()
	p3 := recvErr(t, next)
	if p3.err != nil {
		t.Fatal(p3.err)
	}
	p2.Release() // the window of 2 is complete: used, not inflated
	if got := eff(); got != 4 {
		t.Fatalf("after a used window without inflation: effective limit %d, want 4", got)
	}

	clock.advance(time.Millisecond)
	held := []Permit{p3.p, acquire(t, g, "a"), acquire(t, g, "a"), acquire(t, g, "a")}
	waiters := make(chan acquired, 2)
	for range 2 {
		go func() { p, err := g.Acquire(ctx, "a"); waiters <- acquired{p, err} }()
	}
	waitUntil(t, "two wait", func() bool { return g.Stat().Waiting == 2 })
	clock.advance(40 * time.Millisecond) // four at once took four times as long
	held[0].Release()
	held[1].Release()
	// The two waiters took the freed slots (4 held again), and the window is
	// not complete until all four of the round are back.
	w1, w2 := recvErr(t, waiters), recvErr(t, waiters)
	if w1.err != nil || w2.err != nil {
		t.Fatal(w1.err, w2.err)
	}
	held[2].Release()
	held[3].Release()
	if got := eff(); got != 2 {
		t.Fatalf("after holds 4x the baseline: effective limit %d, want the floor 2", got)
	}
	if s, _ := g.TenantStat("a"); s.InUse != 2 {
		t.Fatalf("in use %d, want the 2 granted before the cut", s.InUse)
	}
	ch := acquireAsync(ctx, g, "a") // at the new limit: waits
	waitUntil(t, "a request waits at the cut limit", func() bool { return g.Stat().Waiting == 1 })
	w1.p.Release()
	r := recvErr(t, ch)
	if r.err != nil {
		t.Fatal(r.err)
	}
	w2.p.Release()
	r.p.Release()
	if n := violations.Load(); n != 0 {
		t.Fatalf("%d grants above the effective limit", n)
	}
	if s := g.Stat(); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("%d in use, %d waiting at the end", s.InUse, s.Waiting)
	}
}

func TestAdaptiveOffLeavesTheCap(t *testing.T) {
	g, _ := newTestGate(t, Config{Capacity: 4, Plans: map[string]Plan{"p": {MaxConns: 3}}})
	p := acquire(t, g, "a")
	defer p.Release()
	if s, _ := g.TenantStat("a"); s.Limit != 3 || s.EffectiveLimit != 3 {
		t.Fatalf("Limit %d EffectiveLimit %d, want both the cap 3", s.Limit, s.EffectiveLimit)
	}
}

func TestAdaptiveFloorKeepsTheReservation(t *testing.T) {
	g, _ := newTestGate(t, Config{Capacity: 10, MaxReserved: 5,
		Plans:    map[string]Plan{"p": {MaxConns: 8, ReservedConns: 4}},
		Adaptive: Adaptive{Enabled: true}})
	p := acquire(t, g, "a")
	defer p.Release()
	if s, _ := g.TenantStat("a"); s.EffectiveLimit != 4 || s.Reserved != 4 {
		t.Fatalf("EffectiveLimit %d Reserved %d, want both 4: the floor is raised to the reservation", s.EffectiveLimit, s.Reserved)
	}
}

// TestAdaptiveRejectPlanRejectsOnlyOverTheCap: with MaxWaiting 0, requests
// over the effective limit but under the cap wait for it; only those over
// the cap are rejected, at once.
func TestAdaptiveRejectPlanRejectsOnlyOverTheCap(t *testing.T) {
	violations := countViolations(t)
	g, clock := newTestGate(t, Config{Capacity: 10, MaxReserved: 1,
		Plans:    map[string]Plan{"p": {MaxConns: 4}}, // MaxWaiting 0: reject over the cap
		Adaptive: Adaptive{Enabled: true, MinConns: 2}})
	ctx := context.Background()
	p1, p2 := acquire(t, g, "a"), acquire(t, g, "a") // the floor, 2
	w3, w4 := acquireAsync(ctx, g, "a"), acquireAsync(ctx, g, "a")
	waitUntil(t, "two wait for the effective limit", func() bool { return g.Stat().Waiting == 2 })
	_, err := g.Acquire(ctx, "a")
	var over *OverLimitError
	if !errors.As(err, &over) {
		t.Fatalf("fifth request: %v, want an *OverLimitError: it is over the cap of 4", err)
	}
	clock.advance(10 * time.Millisecond)
	p1.Release() // one of the two waiting takes the slot
	waitUntil(t, "one waiter is served", func() bool { return g.Stat().Waiting == 1 })
	p2.Release() // a window of 2 without inflation: the limit doubles to 4, the other is served
	r3, r4 := recvErr(t, w3), recvErr(t, w4)
	if r3.err != nil || r4.err != nil {
		t.Fatal(r3.err, r4.err)
	}
	if s, _ := g.TenantStat("a"); s.EffectiveLimit != 4 || s.InUse != 2 || s.Rejected != 1 {
		t.Fatalf("effective limit %d, in use %d, rejected %d; want 4, 2, 1", s.EffectiveLimit, s.InUse, s.Rejected)
	}
	r3.p.Release()
	r4.p.Release()
	if n := violations.Load(); n != 0 {
		t.Fatalf("%d grants above the effective limit", n)
	}
}

// TestAdaptiveLimitCutsEarlyWhenMostOfAWindowIsInflated: after slow start
// doubles a CPU-bound tenant from 2 to 4, three inflated holds of the four
// are enough to cut; waiting for the fourth would queue the database at 4
// for another round. Holds that are not inflated never cut early.
func TestAdaptiveLimitCutsEarlyWhenMostOfAWindowIsInflated(t *testing.T) {
	cfg := adaptiveDefaults(t)
	ms := int64(time.Millisecond)
	a := newAdaptiveLimit(2, 1)
	now := int64(1)
	// A window at 2: holds of 600 ms set the baseline, and the limit doubles.
	a.granted(1)
	a.granted(2)
	now += 600 * ms
	a.observe(1, 600*ms, now, 1, &cfg, 2, 10)
	if l := a.observe(1, 600*ms, now, 0, &cfg, 2, 10); l != 4 {
		t.Fatalf("after a clean window at 2: limit %d, want 4", l)
	}
	start := now + 1
	for i := range 4 {
		a.granted(i + 1)
	}
	now += 1200 * ms // four at once on one core: twice the baseline
	for i, want := range []int{4, 4} {
		if l := a.observe(start, 1200*ms, now, 3-i, &cfg, 2, 10); l != want {
			t.Fatalf("inflated hold %d of 4: limit %d, want %d (half a window is not a majority)", i+1, l, want)
		}
	}
	if l := a.observe(start, 1200*ms, now, 1, &cfg, 2, 10); l >= 4 {
		t.Fatalf("third inflated hold of 4: limit %d, want a cut below 4 now", l)
	}

	// Waiting-type holds at the baseline: a full window, no early cut.
	b := newAdaptiveLimit(2, 1)
	limits, _ := simulate(b, cfg, 2, 10, 4, 1, waitingType(600*time.Millisecond))
	if limits[len(limits)-1] != 10 {
		t.Fatalf("waiting-type limits %v, want the cap with no cut", limits)
	}
}

// TestAdaptiveDefaultFloorIsOne: a cold tenant starts at one permit, so that
// a CPU-bound tenant's baseline is measured with one query running and a
// one-core database is not queued by the floor itself.
func TestAdaptiveDefaultFloorIsOne(t *testing.T) {
	cfg := adaptiveDefaults(t)
	if cfg.MinConns != 1 {
		t.Fatalf("default MinConns %d, want 1", cfg.MinConns)
	}
	g, _ := newTestGate(t, Config{Capacity: 10, Plans: map[string]Plan{"p": {MaxConns: 8, MaxWaiting: Unbounded}},
		Adaptive: Adaptive{Enabled: true}})
	p := acquire(t, g, "a")
	defer p.Release()
	if s, _ := g.TenantStat("a"); s.EffectiveLimit != 1 {
		t.Fatalf("cold tenant: EffectiveLimit %d, want the default floor 1", s.EffectiveLimit)
	}
}

// TestAdaptiveLimitOneCoreStaysAtOne: on a database with one core (n at
// once take n times as long), one query at a time is the best static
// limit. From the floor 1 the controller tries 2, is cut, and tries it
// again only after a backoff that grows with every failed try: over two
// minutes of 300 ms queries it holds 2 a small share of the time, its
// tries further and further apart up to the longest backoff.
func TestAdaptiveLimitOneCoreStaysAtOne(t *testing.T) {
	cfg := adaptiveDefaults(t)
	a := newAdaptiveLimit(1, 1)
	limits := simulateOneCore(a, cfg, 1, 10, 120*time.Second, 100*time.Millisecond, 300*time.Millisecond)
	above, tries := 0, []int{}
	for i, l := range limits {
		if l > 2 {
			t.Fatalf("at %v: limit %d, want at most 2; %v", time.Duration(i)*100*time.Millisecond, l, limits)
		}
		if l > 1 {
			above++
			if i == 0 || limits[i-1] == 1 {
				tries = append(tries, i)
			}
		}
	}
	if share := float64(above) / float64(len(limits)); share > 0.1 {
		t.Errorf("limit above 1 for %.0f%% of the time, want at most 10%%; tries at (x100 ms) %v", 100*share, tries)
	}
	// Tries at 0.3 s, then 2.4, 8.1, 28.2 s (backoffs of 4, 16, 64 windows),
	// then every 64 windows.
	if len(tries) < 4 {
		t.Fatalf("tries of limit 2 at (x100 ms) %v, want at least 4 in two minutes", tries)
	}
	for i := 2; i < len(tries); i++ {
		gap, prev := tries[i]-tries[i-1], tries[i-1]-tries[i-2]
		if gap < prev || (i <= 3 && gap <= prev) {
			t.Fatalf("tries of limit 2 at (x100 ms) %v: the backoff does not grow to its maximum", tries)
		}
	}
}

// TestAdaptiveLimitForgetsTheCeilingWhenItStopsInflating: a tenant whose
// work was CPU-bound (the database busy) and turns waiting-type (the load
// went away) reaches its cap again once a try of the old ceiling is clean.
func TestAdaptiveLimitForgetsTheCeilingWhenItStopsInflating(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour // no probe: the backoff alone must end
	a := newAdaptiveLimit(1, 1)
	_, now := simulate(a, cfg, 1, 10, 100, 1, cpuBound(300*time.Millisecond))
	if a.limit != 1 || a.ceiling != 2 || a.backoff != maxBackoff {
		t.Fatalf("CPU-bound: limit %d, ceiling %d, backoff %d; want 1, 2 and the longest backoff %d", a.limit, a.ceiling, a.backoff, maxBackoff)
	}
	limits, _ := simulate(a, cfg, 1, 10, maxBackoff+6, now, waitingType(300*time.Millisecond))
	if last := limits[len(limits)-1]; last != 10 || a.ceiling != 0 {
		t.Fatalf("waiting-type after CPU-bound: limit %d, ceiling %d; want the cap 10 and no ceiling; %v", last, a.ceiling, limits)
	}
}

func TestAdaptiveLimitWaitingTypeFromTheDefaultFloor(t *testing.T) {
	cfg := adaptiveDefaults(t)
	a := newAdaptiveLimit(cfg.MinConns, 1)
	limits, _ := simulate(a, cfg, cfg.MinConns, 10, 10, 1, waitingType(time.Second))
	// 1 → 2 → 4 → 8 → 10: one round more than from a floor of 2. This is
	// the mechanism, not the goal: 15 requests in 4 rounds where the cap
	// serves 40 make a pure-wait flood of 10 rounds at the cap take at least
	// 13 (1.3x its ideal, where the goal is 1.1x; bench/noisy oracle-flood).
	if limits[3] != 10 {
		t.Fatalf("limits %v, want the cap 10 after 4 rounds", limits)
	}
}

// atCapOnFastWork returns a controller (cap 10, floor 1, no probes) that
// waiting-type work of 1 ms brought to its cap, its config, and the clock.
func atCapOnFastWork(t *testing.T) (Adaptive, *adaptiveLimit, int64) {
	t.Helper()
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	a := newAdaptiveLimit(1, 1)
	_, now := simulate(a, cfg, 1, 10, 10, 1, waitingType(time.Millisecond))
	if a.limit != 10 {
		t.Fatalf("limit %d on fast waiting-type work, want the cap", a.limit)
	}
	return cfg, a, now
}

// TestAdaptiveLimitAtOneTakesOutsideSlowdownAsTheBaseline: a tenant's holds
// grow twentyfold because of others (its own concurrency plays no part): it
// is cut to one, and a hold at one, with none of its own beside it, becomes
// the baseline, so it grows back to its cap without waiting for a probe
// instead of queueing every request behind one at a time.
func TestAdaptiveLimitAtOneTakesOutsideSlowdownAsTheBaseline(t *testing.T) {
	cfg, a, now := atCapOnFastWork(t)
	limits, _ := simulate(a, cfg, 1, 10, 40, now, waitingType(20*time.Millisecond))
	if !slices.Contains(limits, 1) {
		t.Fatalf("limits %v: the slowdown was never taken for queueing (the test shows nothing)", limits)
	}
	if last := limits[len(limits)-1]; last != 10 || a.baseline != int64(20*time.Millisecond) {
		t.Fatalf("limit %d (want the cap), baseline %v (want 20ms) after 40 rounds; %v", last, time.Duration(a.baseline), limits)
	}
}

// TestAdaptiveLimitKeepsPermitsThatStillAddThroughput: a tenant sharing a
// saturated core with someone else's work gets a bigger share of it by
// running more at once; its holds grow, but slower than its concurrency
// (processor sharing with three outside jobs: n at once take (n+3)/4 times
// as long as one), so every permit still adds throughput and none is cut.
// A tenant alone on the core (n at once take n times as long) is cut.
func TestAdaptiveLimitKeepsPermitsThatStillAddThroughput(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	shared := func(n int) time.Duration { return time.Duration(n+3) * 25 * time.Millisecond }
	a := newAdaptiveLimit(1, 1)
	limits, _ := simulate(a, cfg, 1, 4, 20, 1, shared)
	if last := limits[len(limits)-1]; last != 4 {
		t.Fatalf("sharing a core with three outside jobs: limits %v, want the cap 4", limits)
	}
	b := newAdaptiveLimit(1, 1)
	limits, _ = simulate(b, cfg, 1, 4, 20, 1, cpuBound(50*time.Millisecond))
	if last := limits[len(limits)-1]; last != 1 {
		t.Fatalf("alone on the core: limits %v, want 1", limits)
	}
}

// TestAdaptiveLimitFirstDoublingIsJudgedByTolerance: the allowance for
// holds that grow slower than the limit starts above twice the baseline's
// limit. A CPU-bound tenant sharing one core with one other job (n at once
// take (n+1)/2 times as long as one) holds 1.5x as long at two as at one:
// over Tolerance, so two is cut. Under the allowance (2/1.3 = 1.54x at two)
// it was not; when three CPU-bound tenants double together, each one's
// holds double, and the noise of a baseline of one hold brought that under
// 1.54x, so all three grew to four while a quiet tenant's reads queued
// behind twelve scans.
func TestAdaptiveLimitFirstDoublingIsJudgedByTolerance(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	shared := func(n int) time.Duration { return time.Duration(n+1) * 50 * time.Millisecond }
	a := newAdaptiveLimit(1, 1)
	limits, _ := simulate(a, cfg, 1, 4, 20, 1, shared)
	if slices.Max(limits[1:]) > 2 || limits[len(limits)-1] != 1 {
		t.Fatalf("holds 1.5x as long at two as at one: limits %v, want a cut to 1 and no growth above 2", limits)
	}
}

// TestAdaptiveLimitRecoversFromOutsideSlowdownAtOnce: others' load slows a
// tenant's holds twentyfold in spells, with a moment of fast holds between
// them (the others' scans finish and start again), as a quiet tenant's
// reads beside a noisy tenant's bursts of scans. Each fast moment lowers the
// baseline and the next spell cuts the tenant to one; a hold inflated at one,
// with none of its own beside it, shows that its own concurrency did not
// cause the inflation, so the ceiling that cut left is dropped and slow
// start resumes. Without that the ceilings and their growing backoff kept
// it far below its cap for most of every spell, and its requests queued
// at its own gate.
func TestAdaptiveLimitRecoversFromOutsideSlowdownAtOnce(t *testing.T) {
	cfg, a, now := atCapOnFastWork(t)
	var limits []int
	for range 10 {
		var spell []int
		spell, now = simulate(a, cfg, 1, 10, 20, now, waitingType(20*time.Millisecond))
		limits = append(limits, spell...)
		_, now = simulate(a, cfg, 1, 10, 1, now, waitingType(time.Millisecond))
	}
	high := 0
	for _, l := range limits {
		if l >= 8 {
			high++
		}
	}
	if !slices.Contains(limits, 1) {
		t.Fatalf("limits %v: the slowdown was never taken for queueing (the test shows nothing)", limits)
	}
	if share := float64(high) / float64(len(limits)); share < 0.6 {
		t.Fatalf("limit at 8 or more in %.0f%% of the slow rounds, want at least 60%%; %v", 100*share, limits)
	}
}

// TestAdaptiveLimitKeepsItsCeilingWhenItsOwnConcurrencyInflates: a
// CPU-bound tenant alone on one core (n at once take n times as long) whose
// core is also slowed twofold by others in spells, with a moment at full
// speed between them. Each spell inflates its hold at one, but its holds at
// two, when it was cut, were twice as long again: its own concurrency
// inflated them, so the ceiling and its backoff stay, and it tries two as
// rarely as without the spells.
func TestAdaptiveLimitKeepsItsCeilingWhenItsOwnConcurrencyInflates(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	a := newAdaptiveLimit(1, 1)
	_, now := simulate(a, cfg, 1, 10, 100, 1, cpuBound(300*time.Millisecond))
	var limits []int
	for range 20 {
		var spell []int
		spell, now = simulate(a, cfg, 1, 10, 10, now, cpuBound(600*time.Millisecond))
		limits = append(limits, spell...)
		_, now = simulate(a, cfg, 1, 10, 1, now, cpuBound(300*time.Millisecond))
	}
	above := 0
	for _, l := range limits {
		if l > 1 {
			above++
		}
	}
	if share := float64(above) / float64(len(limits)); share > 0.1 {
		t.Fatalf("limit above 1 in %.0f%% of the slow rounds, want at most 10%%; %v", 100*share, limits)
	}
}

// simulateTenantsOneCore runs tenants that each send scans queries of work
// CPU time at once, through a controller each, against one core shared by
// every permit held (processor sharing). It returns the time-weighted mean
// of the permits held at once, every tenant's together: how many queries a
// quiet tenant's read shares the core with.
func simulateTenantsOneCore(cfg Adaptive, tenants, scans int, work time.Duration) float64 {
	type permit struct {
		tenant      int
		start, left int64
	}
	ctl := make([]*adaptiveLimit, tenants)
	left := make([]int, tenants)
	inUse := make([]int, tenants)
	for i := range ctl {
		ctl[i], left[i] = newAdaptiveLimit(1, 1), scans
	}
	var held []permit
	now, area := int64(1), 0.0
	for {
		for i, a := range ctl {
			for left[i] > 0 && inUse[i] < a.limit {
				left[i]--
				inUse[i]++
				a.granted(inUse[i])
				a.held(now)
				held = append(held, permit{tenant: i, start: now, left: int64(work)})
			}
		}
		if len(held) == 0 {
			return area / float64(now-1)
		}
		k := 0
		for j := range held {
			if held[j].left < held[k].left {
				k = j
			}
		}
		n := int64(len(held))
		done := held[k].left
		area += float64(done * n * n)
		now += done * n
		for j := range held {
			held[j].left -= done
		}
		p := held[k]
		held = append(held[:k], held[k+1:]...)
		inUse[p.tenant]--
		ctl[p.tenant].observe(p.start, now-p.start, now, inUse[p.tenant], &cfg, 1, 10)
	}
}

// TestAdaptiveLimitSeveralCPUBoundTenantsLearnAtOnce: three CPU-bound
// tenants each send six scans at once to a one-core database, as in the
// oracle-multi benchmark. Each starts at one and tries two; with three of
// them the holds at two are three times as long, so a cut that waits for a
// third inflated hold at two comes when each tenant's six scans are nearly
// done, and the core runs six at once (static cap 2's load) most of the
// time (5.4, 5.0 and 4.5 on average with 5, 6 and 8 scans each). Cut on a
// full window of two inflated holds, it runs 4.3 at most (4.2, 4.0, 3.75)
// against static cap 1's 3: slow start's one step to two is still paid.
func TestAdaptiveLimitSeveralCPUBoundTenantsLearnAtOnce(t *testing.T) {
	cfg := adaptiveDefaults(t)
	for _, scans := range []int{5, 6, 8} {
		if mean := simulateTenantsOneCore(cfg, 3, scans, 200*time.Millisecond); mean > 4.3 {
			t.Errorf("three tenants of %d scans: %.2f held at once on average, want at most 4.3 (static cap 1: 3)", scans, mean)
		}
	}
}

// simulateOpenLoop runs requests that arrive every `every` through a
// controller and a FIFO queue at its limit, as the Gate does (which tells
// the controller when the tenant holds none and none wait): request i,
// granted when n permits are held with it, is held for hold(i, n). It
// returns how many requests waited at the limit and their mean hold.
func simulateOpenLoop(a *adaptiveLimit, cfg Adaptive, floor, cap, requests int, every time.Duration, hold func(i, n int) time.Duration) (waited int, held time.Duration) {
	type permit struct{ start, end int64 }
	var inUse []permit
	var queue []int64 // arrival times
	now, next, arrived := int64(1), int64(1), 0
	var holdSum int64
	grant := func() {
		for len(queue) > 0 && len(inUse) < a.limit {
			if now > queue[0] {
				waited++
			}
			i := arrived - len(queue)
			queue = queue[1:]
			a.granted(len(inUse) + 1)
			a.held(now)
			h := int64(hold(i, len(inUse)+1))
			holdSum += h
			inUse = append(inUse, permit{start: now, end: now + h})
		}
	}
	for arrived < requests || len(inUse) > 0 || len(queue) > 0 {
		k := -1
		for j := range inUse {
			if k < 0 || inUse[j].end < inUse[k].end {
				k = j
			}
		}
		if arrived < requests && (k < 0 || next <= inUse[k].end) {
			now = next
			queue = append(queue, now)
			arrived++
			next += int64(every)
		} else {
			p := inUse[k]
			now = p.end
			inUse = append(inUse[:k], inUse[k+1:]...)
			a.observe(p.start, p.end-p.start, now, len(inUse), &cfg, floor, cap)
			if len(inUse) == 0 && len(queue) == 0 {
				a.emptied(now, floor, cap)
			}
		}
		grant()
	}
	return waited, time.Duration(holdSum / int64(requests))
}

// TestAdaptiveLimitQuietTenantIsNotCutForOthersLoad: a quiet tenant reads
// every 5 ms; its reads take 0.5 ms alone, then others' scans slow them
// eightfold, one in four waits out a scheduler slice (9 ms) so that the next
// read runs beside it, and one in ten finds the core free between two scans
// (0.5 ms, which lowers the baseline again); running two at once adds only
// 0.5 ms. Its holds were inflated at two and it was cut to one, so 10% of
// its reads queued at its own gate behind a slow one. Reads that ran with
// none of its own beside them were as slow: its own concurrency did not
// cause the inflation, so they become the baseline and nothing is cut.
func TestAdaptiveLimitQuietTenantIsNotCutForOthersLoad(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	a := newAdaptiveLimit(1, 1)
	simulateOpenLoop(a, cfg, 1, 10, 200, 5*time.Millisecond, func(int, int) time.Duration { return 500 * time.Microsecond })
	waited, held := simulateOpenLoop(a, cfg, 1, 10, 2000, 5*time.Millisecond, func(i, n int) time.Duration {
		d := 4 * time.Millisecond
		switch {
		case i%4 == 0:
			d = 9 * time.Millisecond
		case i%10 == 5:
			d = 500 * time.Microsecond // between two scans, the core was free
		}
		return d + time.Duration(n-1)*500*time.Microsecond
	})
	if waited > 2000/100 {
		t.Fatalf("%d of 2000 reads waited at the quiet tenant's own limit (mean hold %v, limit now %d), want at most 1%%: its p99", waited, held, a.limit)
	}
}

// simPermit is a permit held in a simulation on one core: a scan needs left
// ns of CPU time more, a wait ends at left.
type simPermit struct {
	start, left int64
	isScan      bool
}

// oneCoreRelease finds the permit of held that ends first, at end, when the
// scans among them share one core from now on (processor sharing) and each
// wait ends at its time. It takes the CPU time the scans get until then off
// each, and returns the permit's index, end, and the scans held at once
// times the time passed (for their mean).
func oneCoreRelease(held []simPermit, now int64) (i int, end int64, scanned float64) {
	scans := int64(0)
	for _, p := range held {
		if p.isScan {
			scans++
		}
	}
	i, end = -1, int64(math.MaxInt64)
	for j, p := range held {
		e := p.left
		if p.isScan {
			e = now + p.left*scans
		}
		if e < end {
			i, end = j, e
		}
	}
	for j := range held {
		if held[j].isScan {
			held[j].left -= (end - now) / scans
		}
	}
	return i, end, float64(scans * (end - now))
}

// simulateTurnsOneCore runs a tenant that always has work waiting, as the
// Gate does, whose requests are scans and waits in turn (request i scans
// when i is even), against one core: a scan needs scan of CPU time, shared
// by the scans held at once; a wait takes wait however many run. It returns
// the mean number of scans held at once, over d. With scan 0 it only waits.
func simulateTurnsOneCore(a *adaptiveLimit, cfg Adaptive, floor, cap int, d, scan, wait time.Duration) float64 {
	var held []simPermit
	now, next, area := int64(1), 0, 0.0
	for now < int64(d) {
		for len(held) < a.limit {
			a.granted(len(held) + 1)
			a.held(now)
			p := simPermit{start: now, left: now + int64(wait)}
			if next%2 == 0 && scan > 0 {
				p = simPermit{start: now, left: int64(scan), isScan: true}
			}
			next++
			held = append(held, p)
		}
		i, end, scanned := oneCoreRelease(held, now)
		area += scanned
		now = end
		p := held[i]
		held = append(held[:i], held[i+1:]...)
		a.observe(p.start, now-p.start, now, len(held), &cfg, floor, cap)
	}
	return area / float64(now-1)
}

// TestAdaptiveLimitScansBesideWaitsAreSeen: a backlogged tenant sends scans
// and waits in turn (the oracle-turns benchmark). Judged by each window's
// shortest hold, always a wait that does not inflate, it grew to the cap and
// ran as many scans at once on the one core as static cap 10 (9.1); judged
// also by how long a busy window takes (its mean hold), it runs about as
// many as static cap 3 (2.5; static 2 runs 1.5, static 4 3.5).
func TestAdaptiveLimitScansBesideWaitsAreSeen(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	const d, scan, wait = 20 * time.Second, 200 * time.Millisecond, 100 * time.Millisecond
	static4 := simulateTurnsOneCore(newAdaptiveLimit(4, 1), cfg, 4, 4, d, scan, wait)
	a := newAdaptiveLimit(1, 1)
	if scans := simulateTurnsOneCore(a, cfg, 1, 10, d, scan, wait); scans >= static4 {
		t.Errorf("%.2f scans held at once on average, limit %d at the end; want fewer than static cap 4's %.2f", scans, a.limit, static4)
	}
	b := newAdaptiveLimit(1, 1)
	if scans := simulateTurnsOneCore(b, cfg, 1, 10, 20*time.Second, 0, 100*time.Millisecond); b.limit != 10 {
		t.Errorf("waits only: limit %d, want the cap 10 (%.2f scans)", b.limit, scans)
	}
}

// TestAdaptiveLimitStepIsJudgedByItsLongestHold: a backlogged tenant sends
// scans and waits in turn, with scans not much longer than its waits (the
// oracle-turns benchmark on this machine). Each window's shortest hold is a
// wait, and its busy span stays within the allowance the limit earns, so
// without more it grew past two and held as many scans at once as static
// cap 3 or 4 (2.97 and 2.51 against static cap 2's 1.33 and 1.50). A step
// above two whose longest hold exceeds Tolerance times the longest of the
// window before the step goes back: within 1.1x static cap 2's (1.07x and
// 1.05x).
func TestAdaptiveLimitStepIsJudgedByItsLongestHold(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	const d, wait = 20 * time.Second, 100 * time.Millisecond
	for _, scan := range []time.Duration{150 * time.Millisecond, 200 * time.Millisecond} {
		static2 := simulateTurnsOneCore(newAdaptiveLimit(2, 1), cfg, 2, 2, d, scan, wait)
		a := newAdaptiveLimit(1, 1)
		if scans := simulateTurnsOneCore(a, cfg, 1, 10, d, scan, wait); scans > 1.1*static2 {
			t.Errorf("scans of %v: %.2f scans held at once on average, limit %d at the end; want within 1.1x static cap 2's %.2f",
				scan, scans, a.limit, static2)
		}
	}
}

// burst is a number of requests of one shape that a tenant sends at once:
// scans of scan CPU time, or waits of wait.
type burst struct {
	n          int
	scan, wait time.Duration
}

// simulateBurstsOneCore runs a tenant that sends bursts one after the
// other, each when the one before is done, as the Gate does: each release is
// fed to the controller, which is told when the tenant holds none and has
// none waiting, then freed slots are granted at once. Scans share one core
// (processor sharing); waits take as long however many run. It returns the
// mean number of scans held at once and the makespan.
func simulateBurstsOneCore(a *adaptiveLimit, cfg Adaptive, floor, cap int, bursts []burst) (float64, time.Duration) {
	var held []simPermit
	now, area := int64(1), 0.0
	for _, b := range bursts {
		left := b.n
		for left > 0 || len(held) > 0 {
			for left > 0 && len(held) < a.limit {
				left--
				a.granted(len(held) + 1)
				a.held(now)
				p := simPermit{start: now, left: now + int64(b.wait)}
				if b.scan > 0 {
					p = simPermit{start: now, left: int64(b.scan), isScan: true}
				}
				held = append(held, p)
			}
			i, end, scanned := oneCoreRelease(held, now)
			area += scanned
			now = end
			p := held[i]
			held = append(held[:i], held[i+1:]...)
			a.observe(p.start, now-p.start, now, len(held), &cfg, floor, cap)
			if len(held) == 0 && left == 0 {
				a.emptied(now, floor, cap)
			}
		}
	}
	return area / float64(now-1), time.Duration(now - 1)
}

// TestAdaptiveLimitScansAfterWaitsStartLow: a tenant sends n scans, 20
// waits, n scans, 20 waits, each burst when the one before is done (the
// oracle-mix benchmark). Its limit grew on the waits (+1 a window after the
// scans' cut, to 7 with 9 scans a burst), and the next scans were all
// granted at that limit at once: 2.4-2.9 scans at once on average with 6 to
// 9 scans a burst, about static cap 4's (2.4-3.1; static cap 2 1.1-1.2). With
// 10 or more, the scans' second cut left a backoff of 16 windows, and the
// waits after them ran one at a time: makespan 1.2-1.4x static cap 4's. A
// tenant that ran into its limit and then emptied starts its next burst as
// a new tenant does (at two at most, no ceiling): fewer scans at once than
// static cap 2, makespan within static cap 4's (5% for rounding).
func TestAdaptiveLimitScansAfterWaitsStartLow(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	const scan, wait = 200 * time.Millisecond, 100 * time.Millisecond
	for _, n := range []int{6, 8, 9, 10, 12, 16} {
		bursts := []burst{{n: n, scan: scan}, {n: 20, wait: wait}, {n: n, scan: scan}, {n: 20, wait: wait}}
		static2, _ := simulateBurstsOneCore(newAdaptiveLimit(2, 1), cfg, 2, 2, bursts)
		_, static4 := simulateBurstsOneCore(newAdaptiveLimit(4, 1), cfg, 4, 4, bursts)
		scans, makespan := simulateBurstsOneCore(newAdaptiveLimit(1, 1), cfg, 1, 10, bursts)
		if scans > static2 || float64(makespan) > 1.05*float64(static4) {
			t.Errorf("%d scans a burst: %.2f scans at once on average, makespan %v; want at most static cap 2's %.2f, within 1.05x static cap 4's %v",
				n, scans, makespan, static2, static4)
		}
	}
}

// TestAdaptiveGateRestartsATenantThatEmpties: a tenant that grew to 4 on
// clean used windows, each with a request waiting, goes back to two when it
// then holds none with none waiting.
func TestAdaptiveGateRestartsATenantThatEmpties(t *testing.T) {
	g, clock := newTestGate(t, Config{Capacity: 20,
		Plans:    map[string]Plan{"p": {MaxConns: 10, MaxWaiting: Unbounded}},
		Adaptive: Adaptive{Enabled: true}})
	eff := func() int {
		s, _ := g.TenantStat("a")
		return s.EffectiveLimit
	}
	ctx := context.Background()
	waitFor := func(ch <-chan acquired) Permit {
		r := recvErr(t, ch)
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.p
	}
	p1 := acquire(t, g, "a")
	w := acquireAsync(ctx, g, "a")
	waitUntil(t, "one waits at the floor", func() bool { return g.Stat().Waiting == 1 })
	clock.advance(10 * time.Millisecond)
	p1.Release() // a clean used window at 1: 2, and the waiter is served
	p2, p3 := waitFor(w), acquire(t, g, "a")
	w = acquireAsync(ctx, g, "a")
	waitUntil(t, "one waits at 2", func() bool { return g.Stat().Waiting == 1 })
	clock.advance(10 * time.Millisecond)
	p2.Release()
	p4 := waitFor(w)
	p3.Release() // a clean used window at 2: 4
	if got := eff(); got != 4 {
		t.Fatalf("after clean used windows at 1 and 2: effective limit %d, want 4", got)
	}
	p4.Release() // none held, none waiting
	if got := eff(); got != restartLimit {
		t.Fatalf("after the tenant emptied: effective limit %d, want %d", got, restartLimit)
	}
}

// simRequest is one request of a simulated burst: a scan of scan CPU time
// when scan is set, else a wait of wait.
type simRequest struct{ scan, wait time.Duration }

// simulateInOrderOneCore runs one burst of requests sent at once and served
// in order, as the Gate does, on one core: scans share it (processor
// sharing), waits take as long however many run. It returns the makespan,
// and how long three or more scans were held at once.
func simulateInOrderOneCore(a *adaptiveLimit, cfg Adaptive, floor, cap int, reqs []simRequest) (makespan, crowded time.Duration) {
	var held []simPermit
	now, next := int64(1), 0
	for next < len(reqs) || len(held) > 0 {
		for next < len(reqs) && len(held) < a.limit {
			a.granted(len(held) + 1)
			a.held(now)
			r := reqs[next]
			p := simPermit{start: now, left: now + int64(r.wait)}
			if r.scan > 0 {
				p = simPermit{start: now, left: int64(r.scan), isScan: true}
			}
			next++
			held = append(held, p)
		}
		i, end, scanned := oneCoreRelease(held, now)
		if scanned >= float64(3*(end-now)) {
			crowded += time.Duration(end - now)
		}
		now = end
		p := held[i]
		held = append(held[:i], held[i+1:]...)
		a.observe(p.start, now-p.start, now, len(held), &cfg, floor, cap)
		if len(held) == 0 && next == len(reqs) {
			a.emptied(now, floor, cap)
		}
	}
	return time.Duration(now - 1), crowded
}

// inTurns returns n requests, a and b in turn, a first.
func inTurns(n int, a, b simRequest) []simRequest {
	reqs := make([]simRequest, n)
	for i := range reqs {
		reqs[i] = a
		if i%2 == 1 {
			reqs[i] = b
		}
	}
	return reqs
}

// TestAdaptiveLimitWaitsOfTwoLengthsKeepTheirConcurrency: 200 waits sent at
// once, of 50 and 150 ms in turn (calls to a remote service whose answers
// vary), in either order. Their mean hold is twice the shortest at every
// limit, so a rule that takes a mean hold over Tolerance times the shortest
// for queueing holds them near two: one tried for oracle-turns (scans and
// waits in turn look the same at a limit of two) took 4.8x static cap 10's
// makespan here. The controller takes 1.21x and 1.45x (slow start, by one
// from two on these unlike holds, and the allowance in proportion to the
// limit; 1.12x and 1.40x while slow start doubled on them); want within 1.5x.
func TestAdaptiveLimitWaitsOfTwoLengthsKeepTheirConcurrency(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	short, long := simRequest{wait: 50 * time.Millisecond}, simRequest{wait: 150 * time.Millisecond}
	for _, reqs := range [][]simRequest{inTurns(200, short, long), inTurns(200, long, short)} {
		static10, _ := simulateInOrderOneCore(newAdaptiveLimit(10, 1), cfg, 10, 10, reqs)
		a := newAdaptiveLimit(1, 1)
		if makespan, _ := simulateInOrderOneCore(a, cfg, 1, 10, reqs); float64(makespan) > 1.5*float64(static10) {
			t.Errorf("first wait %v: makespan %v, want within 1.5x static cap 10's %v", reqs[0].wait, makespan, static10)
		}
	}
}

// TestAdaptiveLimitWidelyVaryingWaitsAreHeldNearTwo pins a limit that
// docs/adaptive-limits.md states with these numbers: 200 waits sent at once,
// uniform in 50-500 ms or lognormal around 100 ms (six seeds each), look
// like queueing to a controller that compares each window's shortest hold
// with the shortest ever seen, and take 4.0-6.5x static cap 10's makespan
// (static cap 2 takes 5x; 3.8-5.6x while slow start doubled on unlike
// holds). It fails when a change lifts the limit: then update the docs with
// the new numbers and this test with them.
func TestAdaptiveLimitWidelyVaryingWaitsAreHeldNearTwo(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	for seed := uint64(1); seed <= 6; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		uniform, lognormal := make([]simRequest, 200), make([]simRequest, 200)
		for i := range uniform {
			uniform[i] = simRequest{wait: time.Duration(50+r.IntN(450)) * time.Millisecond}
			lognormal[i] = simRequest{wait: time.Duration(math.Exp(math.Log(100)+r.NormFloat64())) * time.Millisecond}
		}
		for name, reqs := range map[string][]simRequest{"uniform": uniform, "lognormal": lognormal} {
			static10, _ := simulateInOrderOneCore(newAdaptiveLimit(10, 1), cfg, 10, 10, reqs)
			makespan, _ := simulateInOrderOneCore(newAdaptiveLimit(1, 1), cfg, 1, 10, reqs)
			ratio := float64(makespan) / float64(static10)
			t.Logf("seed %d, %s: %.2fx", seed, name, ratio)
			if ratio < 3.5 {
				t.Errorf("seed %d, %s waits: makespan %.2fx static cap 10's, below the 4.0-6.5x docs/adaptive-limits.md states; update the docs", seed, name, ratio)
			}
		}
	}
}

// TestAdaptiveLimitSlowStartStepsByOneOnUnlikeHolds: one burst of 16
// requests, scans and waits of 100 ms in turn (the oracle-turns benchmark's
// size here). A window at two closed on its first holds to end, two waits
// while a scan was still out, or a scan and a wait; doubling from it granted
// four at once, and three or more scans shared the core for 25-40% of the
// burst, as long as under static cap 3 (25-54%). Slow start now grows by one
// from such windows: 0-10%; want under a quarter of static cap 3's, with a
// makespan within 1.1x static cap 2's (1.04-1.08x; slow start from one).
func TestAdaptiveLimitSlowStartStepsByOneOnUnlikeHolds(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	for _, scan := range []time.Duration{150 * time.Millisecond, 250 * time.Millisecond, 350 * time.Millisecond} {
		reqs := inTurns(16, simRequest{scan: scan}, simRequest{wait: 100 * time.Millisecond})
		static2, _ := simulateInOrderOneCore(newAdaptiveLimit(2, 1), cfg, 2, 2, reqs)
		_, static3 := simulateInOrderOneCore(newAdaptiveLimit(3, 1), cfg, 3, 3, reqs)
		makespan, crowded := simulateInOrderOneCore(newAdaptiveLimit(1, 1), cfg, 1, 10, reqs)
		if crowded > static3/4 || float64(makespan) > 1.1*float64(static2) {
			t.Errorf("scans of %v: three or more at once for %v (static cap 3: %v), makespan %v (static cap 2: %v); want under a quarter of static cap 3's, within 1.1x static cap 2's",
				scan, crowded, static3, makespan, static2)
		}
	}
}

// TestAdaptiveOutForgetsAGrantGivenBack: the controller keeps the grant
// clocks of the permits a tenant holds (doubles reads the oldest). A grant
// that raced its caller's cancellation is given back unheld and must leave
// none behind, or that tenant's slow start would wait on a permit no one
// holds.
func TestAdaptiveOutForgetsAGrantGivenBack(t *testing.T) {
	g, _ := newTestGate(t, Config{Capacity: 1, Adaptive: Adaptive{Enabled: true}})
	giveBackRacedGrant(t, g, acquire(t, g, "a"), "b")
	p := acquire(t, g, "b")
	g.mu.Lock()
	out := slices.Clone(g.tenants["b"].ad.out)
	g.mu.Unlock()
	p.Release()
	if len(out) != 1 {
		t.Fatalf("b holds one permit; its controller has %d grant clocks %v", len(out), out)
	}
}

// TestAdaptiveOutKeepsTheOldestFirst: a fast-path grant reads the clock
// before the Gate's lock, so grant clocks can arrive a little out of order;
// the oldest permit still held is still the one doubles reads.
func TestAdaptiveOutKeepsTheOldestFirst(t *testing.T) {
	a := newAdaptiveLimit(1, 1)
	for _, start := range []int64{10, 30, 20, 5, 40} {
		a.held(start)
	}
	a.let(5)
	if got := a.oldestOut(100); got != 90 || !slices.IsSorted(a.out) {
		t.Fatalf("oldest out %d (grant clocks %v), want 90: the permit granted at 10", got, a.out)
	}
}

// TestAdaptiveLimitScansAndWaitsInTurnPayTheFirstTry pins a limit that
// docs/adaptive-limits.md states with these numbers: bursts of 20 requests
// sent at once, 10 scans (150, 200 or 300 ms of one core) and 10 waits of
// 100 ms in a shuffled order (20 seeds each; the oracle-turns benchmark's
// bursts where a scan alone takes 200 ms), take 1.23x the best static cap's makespan on average
// over the 60 bursts (caps 1 to 4; 1.30x, 1.23x and 1.16x by scan length),
// 1.67x at worst. Slow start's try at two or three often draws two scans
// first: their window is the signal a CPU-bound tenant's try gives, and the
// tenant is cut to one before a window shows that a scan beside a wait
// gains. Judging a window on a third inflated hold (minInflatedSamples 3)
// brings the mean to 1.11x, but three CPU-bound tenants learning at once
// then hold 5.4, 5.0 and 4.5 scans at once on average instead of 4.2, 4.0
// and 3.75 (TestAdaptiveLimitSeveralCPUBoundTenantsLearnAtOnce). It fails when a
// change moves the mean out of 1.15-1.30x: then update the docs with the new
// numbers and this test with them.
func TestAdaptiveLimitScansAndWaitsInTurnPayTheFirstTry(t *testing.T) {
	cfg := adaptiveDefaults(t)
	cfg.ProbeInterval = time.Hour
	var sum, worst float64
	bursts := 0
	for _, scan := range []time.Duration{150 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond} {
		for seed := uint64(1); seed <= 20; seed++ {
			reqs := inTurns(20, simRequest{scan: scan}, simRequest{wait: 100 * time.Millisecond})
			rand.New(rand.NewPCG(seed, 3)).Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
			best := time.Duration(math.MaxInt64)
			for c := 1; c <= 4; c++ {
				m, _ := simulateInOrderOneCore(newAdaptiveLimit(c, 1), cfg, c, c, reqs)
				best = min(best, m)
			}
			m, _ := simulateInOrderOneCore(newAdaptiveLimit(1, 1), cfg, 1, 10, reqs)
			ratio := float64(m) / float64(best)
			sum, worst, bursts = sum+ratio, max(worst, ratio), bursts+1
		}
	}
	mean := sum / float64(bursts)
	t.Logf("makespan %.2fx the best static cap's on average over %d bursts, %.2fx at worst", mean, bursts, worst)
	if mean < 1.15 || mean > 1.30 {
		t.Errorf("makespan %.2fx the best static cap's on average, outside the 1.15-1.30x docs/adaptive-limits.md states; update the docs", mean)
	}
}
