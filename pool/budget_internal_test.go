package pool

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func budgetGate(t *testing.T, maxWaiting int) (*Gate, *fakeClock) {
	return newTestGate(t, Config{Capacity: 10, Plans: map[string]Plan{
		"metered": {MaxConns: 5, MaxWaiting: maxWaiting, Budget: Budget{Rate: 1, Burst: 2 * time.Second}},
	}})
}

// TestBudgetRejects: a tenant whose bucket, less the expected hold of the
// permits it holds, is spent is rejected for the budget under its cap, with
// RetryAfter when the budget allows a call; holds are charged at release;
// the cap's rejections keep CauseCap.
func TestBudgetRejects(t *testing.T) {
	g, clock := budgetGate(t, 0)
	// Burst 2 s, each permit expected to hold 1 s before one is measured.
	p1, p2 := acquire(t, g, "a"), acquire(t, g, "a")
	_, err := g.Acquire(context.Background(), "a") // needs 1 s, 0 left
	var ol *OverLimitError
	if !errors.As(err, &ol) || !errors.Is(err, ErrOverBudget) || !errors.Is(err, ErrOverLimit) || ol.Cause != CauseBudget {
		t.Fatalf("third request with 2 s of budget and 2 permits out: %v, want a budget rejection", err)
	}
	if ol.RetryAfter != time.Second {
		t.Errorf("RetryAfter %v, want 1s: the budget refills 1 s per second", ol.RetryAfter)
	}
	clock.advance(3 * time.Second) // refills to the burst, 2 s
	p1.Release()                   // charged 1 s at grant; its 3 s hold costs 2 s more
	s, _ := g.TenantStat("a")
	if s.BudgetUsed != 3*time.Second || s.BudgetLeft != 0 || s.OverBudget != 1 || s.Rejected != 1 || s.AvgHold != 3*time.Second {
		t.Fatalf("after a 3 s hold: BudgetUsed %v, BudgetLeft %v, OverBudget %d, Rejected %d, AvgHold %v; want 3s, 0s, 1, 1, 3s",
			s.BudgetUsed, s.BudgetLeft, s.OverBudget, s.Rejected, s.AvgHold)
	}
	p2.Release() // the same: -2 s
	if s, _ := g.TenantStat("a"); s.BudgetLeft != -2*time.Second {
		t.Fatalf("in debt: BudgetLeft %v, want -2s", s.BudgetLeft)
	}
	// A request needs its expected hold, 3 s, at most the burst, 2 s: 4 s away.
	if _, err := g.Acquire(context.Background(), "a"); !errors.As(err, &ol) || ol.Cause != CauseBudget || ol.RetryAfter != 4*time.Second {
		t.Fatalf("2 s in debt: %v, want ErrOverBudget retrying after 4s", err)
	}
	clock.advance(4 * time.Second)
	p := acquire(t, g, "a")
	p.Release()

	// The cap's own rejection is not the budget's.
	g2, _ := newTestGate(t, Config{Capacity: 10, Plans: map[string]Plan{"p": {MaxConns: 1, Budget: Budget{Rate: 100}}}})
	q := acquire(t, g2, "b")
	defer q.Release()
	_, err = g2.Acquire(context.Background(), "b")
	if !errors.As(err, &ol) || ol.Cause != CauseCap || errors.Is(err, ErrOverBudget) {
		t.Fatalf("at the cap with budget left: %v, want a cap rejection", err)
	}
	if s, _ := g2.TenantStat("b"); s.OverBudget != 0 || s.Rejected != 1 {
		t.Fatalf("cap rejection counted OverBudget %d, Rejected %d; want 0, 1", s.OverBudget, s.Rejected)
	}
}

// TestBudgetQueues: on a plan that queues, a request out of budget waits in
// the tenant's queue and is admitted when the budget refills, with no
// release to wake it, and nothing held is taken back.
func TestBudgetQueues(t *testing.T) {
	g, clock := budgetGate(t, 1)
	p1, p2 := acquire(t, g, "a"), acquire(t, g, "a")
	done := make(chan result, 1)
	go func() {
		p, err := g.Acquire(context.Background(), "a")
		done <- result{p, err}
	}()
	waitUntil(t, "the third request waits", func() bool { s, _ := g.TenantStat("a"); return s.Waiting == 1 })
	if _, err := g.Acquire(context.Background(), "a"); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("a fourth request with the queue full: %v, want ErrOverBudget", err)
	}
	select {
	case r := <-done:
		t.Fatalf("admitted before the budget refilled: %v", r.err)
	default:
	}
	clock.advance(time.Second) // 1 s of budget: no release wakes the waiter, its own timer does
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.p.Release()
	p1.Release()
	p2.Release()
	if s, _ := g.TenantStat("a"); s.InUse != 0 || s.Waiting != 0 || s.Acquired != 3 {
		t.Fatalf("after the queue drained: %+v", s)
	}
}

type result struct {
	p   Permit
	err error
}

// TestBudgetMaxWait: a request that waits out its plan's MaxWait for the
// budget is refused for the budget (CauseBudget, TimedOut, OverBudget).
func TestBudgetMaxWait(t *testing.T) {
	g, _ := newTestGate(t, Config{Capacity: 10, Plans: map[string]Plan{
		"metered": {MaxConns: 5, MaxWaiting: 1, MaxWait: 5 * time.Millisecond, Budget: Budget{Rate: 1, Burst: time.Second}},
	}})
	p := acquire(t, g, "a")
	defer p.Release()
	_, err := g.Acquire(context.Background(), "a")
	var ol *OverLimitError
	if !errors.As(err, &ol) || ol.Cause != CauseBudget || !errors.Is(err, ErrOverBudget) {
		t.Fatalf("waited out MaxWait for the budget: %v, want a budget refusal", err)
	}
	if s, _ := g.TenantStat("a"); s.TimedOut != 1 || s.OverBudget != 1 || s.Rejected != 0 {
		t.Fatalf("TimedOut %d, OverBudget %d, Rejected %d; want 1, 1, 0", s.TimedOut, s.OverBudget, s.Rejected)
	}
}

// TestBudgetSampledHolds: a tenant whose holds are shorter than
// exactHoldAbove has them sampled (the clock is read for far fewer than the
// two readings per permit that timing every hold takes), and its budget is
// still charged what it held, in expectation, whatever the mix of its
// holds: a long hold among short ones is not free because it was not
// sampled. A tenant with longer holds has every one timed and charged
// exactly.
func TestBudgetSampledHolds(t *testing.T) {
	newGate := func(t *testing.T) (*Gate, *fakeClock, *int) {
		g, clock := newTestGate(t, Config{Capacity: 10, Plans: map[string]Plan{
			"metered": {MaxConns: 5, Budget: Budget{Rate: 1e6, Burst: time.Hour}},
		}})
		reads, inner := new(int), g.clock
		g.clock = func() int64 { *reads++; return inner() }
		return g, clock, reads
	}
	run := func(t *testing.T, g *Gate, clock *fakeClock, holds []time.Duration) (held time.Duration) {
		for _, h := range holds {
			p := acquire(t, g, "a")
			clock.advance(h)
			p.Release()
			held += h
		}
		return held
	}
	const short, long = 10 * time.Microsecond, 10 * time.Millisecond

	t.Run("short holds are sampled", func(t *testing.T) {
		g, clock, reads := newGate(t)
		holds := make([]time.Duration, 20000)
		for i := range holds {
			holds[i] = short
		}
		held := run(t, g, clock, holds)
		s, _ := g.TenantStat("a")
		perPermit := float64(*reads) / float64(len(holds))
		t.Logf("%d permits of %v: %.3f clock readings per permit; charged %v of %v held", len(holds), short, perPermit, s.BudgetUsed, held)
		if perPermit > 0.3 {
			t.Errorf("%.3f clock readings per permit, want about 2/%d: short holds are to be sampled", perPermit, holdSampleEvery)
		}
		if d := float64(s.BudgetUsed-held) / float64(held); d < -0.05 || d > 0.05 {
			t.Errorf("charged %v for %v held", s.BudgetUsed, held)
		}
	})
	for _, mix := range []struct {
		name string
		long func(i int, rng *rand.Rand) bool
	}{
		{"one long hold in 16 at random", func(_ int, rng *rand.Rand) bool { return rng.IntN(16) == 0 }},
		{"long holds between the Gate's ticks", func(i int, _ *rand.Rand) bool { return i%16 != 15 && i%64 < 8 }},
	} {
		t.Run(mix.name, func(t *testing.T) {
			g, clock, _ := newGate(t)
			rng := rand.New(rand.NewPCG(46, 1))
			holds := make([]time.Duration, 120000) // a few percent of standard deviation: see bucket
			for i := range holds {
				holds[i] = short
				if mix.long(i, rng) {
					holds[i] = long
				}
			}
			held := run(t, g, clock, holds)
			s, _ := g.TenantStat("a")
			d := float64(s.BudgetUsed-held) / float64(held)
			t.Logf("charged %v of %v held (%+.1f%%)", s.BudgetUsed, held, 100*d)
			if d < -0.2 || d > 0.2 { // five standard deviations
				t.Errorf("charged %v for %v held: the long holds went uncharged", s.BudgetUsed, held)
			}
		})
	}
	t.Run("long holds are all timed", func(t *testing.T) {
		g, clock, reads := newGate(t)
		holds := make([]time.Duration, 100)
		for i := range holds {
			holds[i] = time.Duration(100+i) * time.Microsecond
		}
		held := run(t, g, clock, holds)
		s, _ := g.TenantStat("a")
		if s.BudgetUsed != held || s.HoldTime != held {
			t.Errorf("charged %v, HoldTime %v, for %v held: every hold at or above %v is timed", s.BudgetUsed, s.HoldTime, held, time.Duration(exactHoldAbove))
		}
		if *reads < 2*len(holds) {
			t.Errorf("%d clock readings for %d permits, want at least 2 each", *reads, len(holds))
		}
	})
}
