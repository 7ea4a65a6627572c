package pool

import (
	"fmt"
	"math"
	"time"
)

// Budget is a plan's share of connection-time for each of its tenants: a
// token bucket of connection-time that fills at Rate and holds at most
// Burst, charged by every permit's hold time when it is released. A request
// passes the tenant stage only while the bucket, less the expected hold
// (the moving average of hold times) of each of the tenant's permits in use
// or granted a slot, still covers its own expected hold (at most Burst);
// otherwise it is rejected with an *OverLimitError whose Cause is
// CauseBudget and whose RetryAfter is when the budget allows a call, or,
// when the plan queues (MaxWaiting), it waits in the tenant's queue until
// then. Nothing running is cancelled. The budget is per process (see
// docs/budgets.md).
type Budget struct {
	// Rate is the connection-seconds per second a tenant may hold on
	// average: 2 lets it hold two connections all the time, or ten a fifth
	// of it. 0 means no budget.
	Rate float64

	// Burst is the most connection-time the bucket saves while the tenant
	// is quiet, and what a new tenant starts with. Default Rate × 1 s.
	Burst time.Duration
}

func (b Budget) validate() error {
	switch {
	case !(b.Rate >= 0) || b.Rate > 1e6:
		return fmt.Errorf("Budget.Rate must be from 0 to 1e6 connection-seconds per second, got %v", b.Rate)
	case b.Burst < 0:
		return fmt.Errorf("Budget.Burst must not be negative, got %v", b.Burst)
	}
	return nil
}

// burst is b's Burst with its default, in ns.
func (b Budget) burst() int64 {
	if b.Burst > 0 {
		return int64(b.Burst)
	}
	return int64(b.Rate * float64(time.Second))
}

// bucket is one tenant's connection-time budget; nil for a tenant whose
// plan never had one. Each permit is charged its expected hold when it is
// granted and the difference to its real hold when it is released, so
// that what is left already counts the permits in use: the tenant cannot
// start its whole cap at once on a bucket that covers one call.
//
// Timing a hold takes two clock readings, which cost more than the rest
// of an uncontended acquire and release. So a hold is timed exactly when
// the tenant's expected hold is at least exactHoldAbove (there the two
// readings are less than 0.05% of it: every database call), and sampled
// otherwise, one permit in holdSampleEvery at random: a permit not timed
// is charged its expected hold, and a timed one of weight w is charged
// w×hold − (w−1)×expected, so that the charge of every permit, long or
// short, is its hold in expectation, whatever mix of holds a tenant makes
// (a sample that is not random could be dodged). A request is admitted
// against the bucket refilled to the last clock reading, which can only
// leave less than is there; the clock is read when that is not enough.
type bucket struct {
	tokens  int64  // ns of connection-time left at at, net of the charges of permits in use; at most the burst
	at      int64  // clock of the last refill
	used    int64  // ns held by the permits released since the tenant was first seen
	refused uint64 // requests rejected or timed out for the budget
}

// exactHoldAbove is the expected hold from which every permit of a
// budgeted tenant is timed.
const exactHoldAbove = int64(100 * time.Microsecond)

// budgetTimingLocked decides how the hold of a permit of t, granted on the
// fast path at now (0 if the clock was not read) and sampled or not by
// the Gate's tick, is timed for t's budget: every one, reading the clock
// now, when t's holds are long enough; else one in holdSampleEvery at
// random. It returns the grant's time and whether to sample.
func (g *Gate) budgetTimingLocked(t *tenant, now int64, sample bool) (int64, bool) {
	if now != 0 || t.plan.Budget.Rate == 0 {
		return now, sample
	}
	if t.avgHold != 0 && t.avgHold < exactHoldAbove { // expectedHold(t) < exactHoldAbove
		return 0, g.sampleRandLocked()%holdSampleEvery == 0
	}
	return g.nowLocked(), false
}

// sampleRandLocked is the next number of the Gate's sampler, a xorshift
// generator seeded at random by New: a tenant cannot tell which of its
// permits are timed.
func (g *Gate) sampleRandLocked() uint64 {
	x := g.sampler
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	g.sampler = x
	return x >> 32
}

// refillLocked brings t's bucket, creating it full, to now (0 creates it
// at a clock reading and refills nothing). t's plan has or had a budget.
// Small enough to inline: between two clock readings there is nothing to
// refill.
func (g *Gate) refillLocked(t *tenant, now int64) *bucket {
	if b := t.bucket; b != nil && now <= b.at {
		return b
	}
	return g.refillSlowLocked(t, now)
}

func (g *Gate) refillSlowLocked(t *tenant, now int64) *bucket {
	if now == 0 {
		now = g.nowLocked()
	}
	ps := t.plan
	b := t.bucket
	if b == nil {
		b = &bucket{tokens: ps.burst, at: now}
		t.bucket = b
	}
	if now > b.at {
		if ps.Budget.Rate > 0 {
			b.tokens = min(ps.burst, b.tokens+int64(ps.Budget.Rate*float64(now-b.at)))
		}
		b.at = now
	}
	return b
}

// budgetLeftLocked is what is left of t's budget for a request at now while
// pending of t's requests hold a tenant slot but no permit yet (each counted
// at its expected hold). t's plan has a budget.
func (g *Gate) budgetLeftLocked(t *tenant, pending int, now int64) int64 {
	return g.refillLocked(t, now).tokens - expectedHold(t)*int64(pending)
}

// expectedHold is what a permit of t is expected to cost its budget: the
// moving average of its hold times, unknownHold before one is measured.
func expectedHold(t *tenant) int64 {
	if t.avgHold > 0 {
		return t.avgHold
	}
	return int64(unknownHold)
}

// budgetAllowsLocked reports whether t's budget lets a request take a slot
// while pending of t's requests hold a tenant slot but no permit yet: what
// is left covers the request's expected hold (or the whole burst, for holds
// longer than it, so that such a tenant is slowed, never locked out). With
// now 0 it first looks with the last clock reading, which refills less
// than the clock would, and reads the clock only if that is not enough.
func (g *Gate) budgetAllowsLocked(t *tenant, pending int, now int64) bool {
	return t.plan.Budget.Rate == 0 || g.budgetCoversLocked(t, pending, now) // inlined: no call without a budget
}

func (g *Gate) budgetCoversLocked(t *tenant, pending int, now int64) bool {
	if now == 0 {
		if g.lastNow != 0 && g.budgetLeftLocked(t, pending, g.lastNow) >= budgetNeed(t) {
			return true
		}
		now = g.nowLocked()
	}
	return g.budgetLeftLocked(t, pending, now) >= budgetNeed(t)
}

// budgetNeed is what must be left of t's budget to admit a request.
func budgetNeed(t *tenant) int64 { return min(expectedHold(t), t.plan.burst) }

// budgetWaitLocked is how long until t's budget lets a request take a slot
// while pending of t's requests hold a tenant slot but no permit yet: 0
// when it does now.
func (g *Gate) budgetWaitLocked(t *tenant, pending int, now int64) time.Duration {
	if t.plan.Budget.Rate == 0 {
		return 0
	}
	short := budgetNeed(t) - g.budgetLeftLocked(t, pending, now)
	if short <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(float64(short) / t.plan.Budget.Rate))
}

// pendingSlots is how many of t's requests hold a tenant slot but no
// permit yet (waiting for global capacity or a cluster slot).
func pendingSlots(t *tenant) int { return t.held() - t.inUse }

// chargeGrantLocked charges a permit s of t, granted at now (0: at the
// last clock reading), its expected hold, if t's plan has a budget. Small
// enough to inline.
func (g *Gate) chargeGrantLocked(t *tenant, s *permitState, now int64) {
	if t.plan.Budget.Rate != 0 {
		s.charged = expectedHold(t)
		g.refillLocked(t, max(now, g.lastNow)).tokens -= s.charged
	}
}

// chargeReleaseLocked settles the budget of s's tenant t for s's hold
// (measured at now when s.weight is positive, else 0): what the permit
// costs less what its grant was charged. A permit timed exactly costs its
// hold; one not timed its expected hold, as charged; a sample of weight w
// w×hold − (w−1)×expected (see bucket).
func (g *Gate) chargeReleaseLocked(t *tenant, s *permitState, hold, now int64) {
	if t.bucket == nil || t.plan.Budget.Rate == 0 && s.charged == 0 {
		return
	}
	if s.weight == 0 { // not timed: it costs what its grant was charged
		t.bucket.used += s.charged
		s.charged = 0
		return
	}
	b := g.refillLocked(t, max(now, g.lastNow))
	cost := s.charged
	if s.weight > 0 {
		cost = s.weight*hold - (s.weight-1)*s.charged
	}
	b.tokens = min(t.plan.burst, b.tokens+s.charged-cost)
	b.used += cost
	s.charged = 0
}

// traceBudget fills d's budget fields for the tracer, once the admission
// of d's tenant has been decided.
func (g *Gate) traceBudget(d *TraceAcquireEndData) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t := g.tenants[d.Tenant]; t != nil && t.plan.Budget.Rate > 0 {
		d.Budgeted = true
		d.BudgetLeft = time.Duration(g.budgetLeftLocked(t, pendingSlots(t), g.nowLocked()))
	}
}
