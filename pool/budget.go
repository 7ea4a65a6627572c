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

// budgetTimingLocked decides how the hold of a permit of t in lane l (nil
// for the default class of a tenant without contention state), granted on
// the fast path at now (0 if the clock was not read) and sampled or not by
// the Gate's tick, is timed for t's budget and its class's: every one,
// reading the clock now, when the holds a budget is charged by are long
// enough; else one in holdSampleEvery at random. It returns the grant's
// time and whether to sample.
func (g *Gate) budgetTimingLocked(t *tenant, l *lane, now int64, sample bool) (int64, bool) {
	if now != 0 {
		return now, sample
	}
	tb, cb := t.plan.Budget.Rate != 0, l != nil && l.class.Budget.Rate != 0
	if !tb && !cb {
		return 0, sample
	}
	if (!tb || shortHolds(t.avgHold)) && (!cb || shortHolds(l.avgHold)) {
		return 0, g.sampleRandLocked()%holdSampleEvery == 0
	}
	return g.nowLocked(), false
}

// shortHolds reports whether holds averaging avg (0: none measured) are
// sampled rather than all timed for a budget.
func shortHolds(avg int64) bool { return avg != 0 && avg < exactHoldAbove }

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

// refillSlowLocked is refillLocked's refill; not inlined, so that
// refillLocked is.
//
//go:noinline
func (g *Gate) refillSlowLocked(t *tenant, now int64) *bucket {
	return g.refillBucketLocked(&t.bucket, t.plan.Budget.Rate, t.plan.burst, now)
}

// refillBucketLocked brings the bucket *bp of a budget of rate and burst
// (ns), creating it full, to now (0: a clock reading).
func (g *Gate) refillBucketLocked(bp **bucket, rate float64, burst, now int64) *bucket {
	if now == 0 {
		now = g.nowLocked()
	}
	b := *bp
	if b == nil {
		b = &bucket{tokens: burst, at: now}
		*bp = b
	}
	if now > b.at {
		if rate > 0 {
			b.tokens = min(burst, b.tokens+int64(rate*float64(now-b.at)))
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

// chargeGrantLocked charges a permit s of class c for t, granted at now
// (0: at the last clock reading), its expected hold, to t's budget and to
// its class's, if they have one. Inlined: no call without a budget.
func (g *Gate) chargeGrantLocked(t *tenant, c *classState, s *permitState, now int64) {
	if t.plan.Budget.Rate != 0 || c.Budget.Rate != 0 {
		g.chargeBudgetsLocked(t, c, s, now)
	}
}

func (g *Gate) chargeBudgetsLocked(t *tenant, c *classState, s *permitState, now int64) {
	if t.plan.Budget.Rate != 0 {
		s.charged = expectedHold(t)
		g.refillLocked(t, max(now, g.lastNow)).tokens -= s.charged
	}
	if c.Budget.Rate != 0 {
		g.chargeClassGrantLocked(t, c, s, now)
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
	settle(g.refillLocked(t, max(now, g.lastNow)), t.plan.burst, s.charged, s.weight, hold)
	s.charged = 0
}

// settle charges bucket b, of a budget whose burst is burst ns, for a
// timed permit of weight w that its grant charged charged and that held
// hold: it costs w×hold − (w−1)×charged, its hold for w 1.
func settle(b *bucket, burst, charged, w, hold int64) {
	cost := w*hold - (w-1)*charged
	b.tokens = min(burst, b.tokens+charged-cost)
	b.used += cost
}

// Budgets per class. A class with a Budget (Class.Budget) gives each
// tenant's work of the class a bucket of its own, in the tenant's lane
// for the class, kept as the tenant's is: charged each permit of the class
// its expected hold (the lane's moving average) at grant and settled at
// release, consulted in the same tenant stage beside the tenant's bucket.
// A request of the class needs both to allow it. Classes never change
// after New, so neither does a class's budget.

// refillLaneLocked brings lane l's bucket, creating it full, to now (0: a
// clock reading). l's class has a budget.
func (g *Gate) refillLaneLocked(l *lane, now int64) *bucket {
	if b := l.bucket; b != nil && now <= b.at {
		return b
	}
	return g.refillBucketLocked(&l.bucket, l.class.Budget.Rate, l.class.burst, now)
}

// expectedLaneHold is what a permit of lane l is expected to cost its
// class's budget: the lane's moving average of hold times, unknownHold
// before one is measured.
func expectedLaneHold(l *lane) int64 {
	if l.avgHold > 0 {
		return l.avgHold
	}
	return int64(unknownHold)
}

// classBudgetLeftLocked is what is left of l's class budget for a request
// at now, less the expected hold of each of l's requests holding a tenant
// slot but no permit yet.
func (g *Gate) classBudgetLeftLocked(l *lane, now int64) int64 {
	return g.refillLaneLocked(l, now).tokens - expectedLaneHold(l)*int64(l.globalQ.n+l.clusterPending)
}

// classBudgetNeed is what must be left of l's class budget to admit a
// request of l: its expected hold, at most the burst.
func classBudgetNeed(l *lane) int64 { return min(expectedLaneHold(l), l.class.burst) }

// classBudgetAllowsLocked reports whether l's class budget, if its class
// has one, lets a request of l take a slot, as budgetAllowsLocked for the
// tenant's. Small enough to inline: no call for a class without a budget.
func (g *Gate) classBudgetAllowsLocked(l *lane, now int64) bool {
	return l.class.Budget.Rate == 0 || g.classBudgetCoversLocked(l, now)
}

func (g *Gate) classBudgetCoversLocked(l *lane, now int64) bool {
	if now == 0 {
		if g.lastNow != 0 && g.classBudgetLeftLocked(l, g.lastNow) >= classBudgetNeed(l) {
			return true
		}
		now = g.nowLocked()
	}
	return g.classBudgetLeftLocked(l, now) >= classBudgetNeed(l)
}

// classBudgetWaitLocked is how long until l's class budget lets a request
// of l take a slot: 0 when it does now, or when the class has no budget.
func (g *Gate) classBudgetWaitLocked(l *lane, now int64) time.Duration {
	if l.class.Budget.Rate == 0 {
		return 0
	}
	short := classBudgetNeed(l) - g.classBudgetLeftLocked(l, now)
	if short <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(float64(short) / l.class.Budget.Rate))
}

// chargeClassGrantLocked charges a permit s of class c, granted to t at
// now (0: at the last clock reading), its lane's expected hold. c has a
// budget.
func (g *Gate) chargeClassGrantLocked(t *tenant, c *classState, s *permitState, now int64) {
	l := &t.wait.lanes[c.index] // a named class's request created t's lanes
	s.classCharged = expectedLaneHold(l)
	g.refillLaneLocked(l, max(now, g.lastNow)).tokens -= s.classCharged
}

// chargeClassReleaseLocked settles lane l's class budget for s's hold, as
// chargeReleaseLocked the tenant's.
func (g *Gate) chargeClassReleaseLocked(l *lane, s *permitState, hold, now int64) {
	if s.weight == 0 {
		l.bucket.used += s.classCharged
	} else {
		settle(g.refillLaneLocked(l, max(now, g.lastNow)), l.class.burst, s.classCharged, s.weight, hold)
	}
	s.classCharged = 0
}

// budgetRefusalLocked is the budget that refused a request of lane l, with
// room under its caps, and how long until it allows one: the tenant's or
// its class's, whichever is further (the class's if only it has one).
func (g *Gate) budgetRefusalLocked(l *lane, now int64) (*bucket, time.Duration) {
	t := l.t
	var b *bucket
	var wait time.Duration
	if t.plan.Budget.Rate > 0 {
		wait = g.budgetWaitLocked(t, pendingSlots(t), now)
		b = t.bucket // budgetWaitLocked made it
	}
	if l.class.Budget.Rate > 0 {
		if cw := g.classBudgetWaitLocked(l, now); b == nil || cw > wait {
			b, wait = l.bucket, cw
		}
	}
	return b, wait
}

// traceBudget fills d's budget fields for the tracer, once the admission
// of d's tenant has been decided: what is left of its tenant's budget or
// of its class's, whichever is less.
func (g *Gate) traceBudget(d *TraceAcquireEndData) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.tenants[d.Tenant]
	if t == nil {
		return
	}
	now := g.nowLocked()
	if t.plan.Budget.Rate > 0 {
		d.Budgeted = true
		d.BudgetLeft = time.Duration(g.budgetLeftLocked(t, pendingSlots(t), now))
	}
	if d.Class == "" || t.wait == nil {
		return
	}
	for i, c := range g.classes {
		if c.name == d.Class && c.Budget.Rate > 0 {
			left := time.Duration(g.classBudgetLeftLocked(&t.wait.lanes[i], now))
			if !d.Budgeted || left < d.BudgetLeft {
				d.BudgetLeft = left
			}
			d.Budgeted = true
		}
	}
}
