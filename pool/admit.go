package pool

import (
	"context"
	"fmt"
	"time"
)

// Admission. A request passes at most three stages, and keeps what each gives
// it until its permit is released. Each stage acts on the request's lane:
// its tenant's part for its class (the default class without WithClass).
//
//  1. tenant slot: one under its lane's limit (the tenant's effective limit
//     t.limit for the default class, the class's cap for the others) and
//     under the tenant's cap. Over either the request is rejected (its
//     lane's queue is full) or waits in the lane's capQ, bounded by the
//     plan's (or the class's) MaxWaiting and MaxWait.
//  2. cluster slot, with Config.Cluster only: a lease from the limiter, asked
//     outside the lock (stageCluster).
//  3. shared capacity: one unit of Config.Capacity, within the class's share,
//     granted from the lane's globalQ by dispatchLocked, reserved lines
//     first, then the classes' rings in weighted round-robin; with
//     Config.Affinity a released permit's unit goes to its own lane's next
//     request first, a bounded number of times in a row (affineLocked).
//
// A request that finds its lane with no one waiting and its limits and
// capacity free takes all at once (the fast path, no waiter). Every other
// request gets a waiter and runs admitLocked's loop, each turn acting on the
// stage it is in, until it is granted or fails.
//
// Invariants, true whenever g.mu is free:
//   - Bulkhead: t.held() (in use, in a globalQ, asking the cluster) is at
//     most t.cap, and each lane's l.held() at most its limit, but for
//     permits in use when a cut came (never revoked) and requests that were
//     asking the cluster then (they recheck on return). A cut sends the
//     latest holders in a globalQ back to the front of their capQ.
//   - Waiting holds no capacity: stages 1 and 2 take no unit of it; g.used
//     counts granted permits only and never exceeds Config.Capacity, nor a
//     class's c.used its share.
//   - No barging: a request takes the fast path only when none of its
//     lane's requests wait, and grantableLocked lets it pass no one the
//     fair gate would serve first (affineLocked passes them, within its
//     bound); after every change that frees capacity or queues a request,
//     dispatchLocked leaves no request in a globalQ that could be granted,
//     and promoteLocked none in a capQ that could take a tenant slot.
//   - Reservations: g.reservedFree is Σ max(0, t.reserved-t.inUse), and no
//     grant to a tenant at or over its reservation leaves fewer free units.
//   - MaxWait counts from arrival and bounds only the time spent in capQ
//     and asking the cluster: the cluster is asked for what is left of it.
//   - One exit: a waiter leaves through leaveLocked, which counts its outcome
//     once, hands its lease to its permit or releases it, and gives back a
//     grant that raced its caller's cancellation. g.waiting (and its class's
//     waiting) counts a waiter from arrival until it is granted or fails.

// acquire is Acquire without the tracer: arrival, the fast path, rejection,
// then the admission loop.
func (g *Gate) acquire(ctx context.Context, id string, d *TraceAcquireEndData) (Permit, error) {
	d.Outcome = Failed
	if len(id) == 0 || len(id) > g.cfg.MaxTenantIDLen {
		return Permit{}, validateID(id, g.cfg.MaxTenantIDLen)
	}
	if err := ctx.Err(); err != nil {
		return Permit{}, g.endedOnArrival(id, err, d)
	}
	if g.runners.Load() && jobOf(ctx) == g {
		return Permit{}, fmt.Errorf("pool: tenant %q: %w", id, ErrRunnerOwnGate)
	}
	class, err := g.classOf(ctx)
	if err != nil {
		return Permit{}, fmt.Errorf("pool: tenant %q: %w", id, err)
	}
	if class.index != 0 {
		d.Class = class.name
	}
	var now int64
	if g.resolves() || g.cfg.Tracer != nil || g.cfg.Adaptive.Enabled {
		now = g.clock() // Lookup and Placement answers expire; traced and adaptive permits are all timed
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return Permit{}, ErrClosed
	}
	t := g.recent
	if t == nil || t.id != id {
		t = g.tenants[id] // a tracked ID was validated when it was first seen
	}
	if t == nil || (g.resolves() && now-t.resolvedAt > int64(g.cfg.LookupTTL) && !t.refreshing) {
		var err error
		if t, err = g.resolveLocked(ctx, id, t); err != nil {
			return Permit{}, err // resolveLocked unlocked
		}
	}
	g.recent = t
	if t.idleList != notIdle {
		g.unidleLocked(t)
	}
	if t.planVersion != t.plan.version {
		g.applyLimitLocked(t) // SetPlan has not reached this tenant yet
	} else if t.reserved < min(t.plan.ReservedConns, t.cap) {
		g.reserveLocked(t)      // a reservation that did not fit may fit now
		g.dispatchLocked(t.srv) // and its waiters may go first now
	}
	var l *lane // nil for the default class of a tenant that never waited nor used a class
	if class.index != 0 || t.wait != nil {
		l = &t.contended(g.classes).lanes[class.index]
	}
	if g.cfg.Tracer != nil {
		d.Plan, d.Limit, d.EffectiveLimit, d.InUse = t.plan.name, t.cap, t.limit, t.inUse
		if l != nil && class.index != 0 {
			d.Limit, d.EffectiveLimit, d.InUse = min(t.plan.classCaps[class.index], t.cap), g.laneLimitLocked(l), l.inUse
		}
	}

	if g.cfg.Cluster == nil && g.fastLocked(t, l, class, now) {
		// The fast path. Hold time is measured on one permit in 16 (all
		// when traced, adaptive or with a Lookup, which read the clock
		// anyway), because reading the clock costs more than the rest of
		// this path.
		g.takeLocked(t, class)
		p := g.newPermitLocked(t, class, now)
		g.countLocked(t, l, class, Acquired)
		g.sampleTick++
		sample := g.sampleTick%holdSampleEvery == 0
		if t.bucket != nil || l != nil && l.bucket != nil {
			now, sample = g.budgetTimingLocked(t, l, now, sample) // see bucket
		}
		if now != 0 {
			p.s.start, p.s.weight = now, 1
			g.heldLocked(t, class, now)
		} else if sample {
			p.s.start, p.s.weight = g.nowLocked(), holdSampleEvery
		}
		if sample {
			g.sweepLocked(p.s.start, sweepBudget)
		}
		g.mu.Unlock()
		d.Outcome = Acquired
		return p, nil
	}
	if l == nil {
		l = &t.contended(g.classes).lanes[0]
	}
	withinLimit := l.capQ.n == 0 && l.held() < g.laneLimitLocked(l) && t.held() < t.cap &&
		g.budgetAllowsLocked(t, pendingSlots(t), now) && g.classBudgetAllowsLocked(l, now)
	if !withinLimit {
		// Decided before anything is allocated or the clock read: a tenant
		// flooding past its cap is exactly when rejections must be cheap.
		// Under an adaptive limit, requests that the cap would admit wait
		// for the effective limit outside MaxWaiting: adaptivity delays
		// work, it never turns it away.
		maxWaiting, _ := l.policy()
		queueRoom := maxWaiting
		if t.ad != nil && class.index == 0 {
			queueRoom += max(0, t.cap-t.held())
		}
		if maxWaiting != Unbounded && l.capQ.n >= queueRoom && !isRunnerRequest(ctx) {
			err := g.refusalLocked(l, 0)
			g.countLocked(t, l, class, Rejected)
			g.mu.Unlock()
			d.Outcome = Rejected
			return Permit{}, err
		}
	}
	if now == 0 {
		now = g.nowLocked()
	}
	w := newWaiter(l, now)
	if isRunnerRequest(ctx) {
		w.deadline = 0 // the Runner bounds its own waits, also after a cut sends w back to capQ
	}
	switch {
	case withinLimit && g.cfg.Cluster != nil:
		w.stage, w.promoted = stageCluster, now
		l.clusterPending++
		t.clusterPending++
	case withinLimit:
		d.Position = l.globalQ.n + 1
		w.stage, w.promoted = stageGlobal, now
		l.globalQ.pushBack(&w.qlink)
		g.fixLinesLocked(t)
	default:
		d.Position = l.globalQ.n + l.capQ.n + 1
		w.stage = stageCap
		l.capQ.pushBack(&w.qlink)
	}
	g.waiting++
	class.waiting++
	return g.admitLocked(ctx, w, d)
}

// endedOnArrival fails a request whose ctx ended before it arrived. The ID
// is validated first, as a new tenant's is: an invalid one is ErrInvalidTenant
// (Failed), never a cancellation. The outcome is then ctx's, and the tracer
// learns the plan only of a tenant the Gate already tracks, so that an ID
// nobody resolved is not measured as a tenant's.
func (g *Gate) endedOnArrival(id string, ctxErr error, d *TraceAcquireEndData) error {
	if err := validateID(id, g.cfg.MaxTenantIDLen); err != nil {
		return err
	}
	d.Outcome = ctxOutcome(ctxErr)
	if g.cfg.Tracer != nil {
		g.mu.Lock()
		if t := g.tenants[id]; t != nil && t.plan != nil {
			d.Plan = t.plan.name
		}
		g.mu.Unlock()
	}
	return fmt.Errorf("pool: tenant %q: %w", id, ctxErr)
}

// fastLocked reports whether a request of class c for t can be granted on
// arrival: none of its lane's requests wait, the lane and the tenant have a
// free slot, and grantableLocked lets it pass. l is nil for the default
// class of a tenant with no contention state, which holds only permits of
// that class.
func (g *Gate) fastLocked(t *tenant, l *lane, c *classState, now int64) bool {
	if l == nil {
		return t.inUse < t.limit && g.grantableLocked(t, c) && g.budgetAllowsLocked(t, 0, now)
	}
	return l.capQ.n+l.globalQ.n == 0 && l.held() < g.laneLimitLocked(l) && t.held() < t.cap && g.grantableLocked(t, c) &&
		g.budgetAllowsLocked(t, pendingSlots(t), now) && g.classBudgetAllowsLocked(l, now)
}

// admitLocked is the admission loop: each turn acts on the stage w is in,
// until w is granted or fails. Called with g.mu held; returns with it released.
func (g *Gate) admitLocked(ctx context.Context, w *waiter, d *TraceAcquireEndData) (Permit, error) {
	var timer *time.Timer // armed when w first waits in capQ, for what is left of its MaxWait
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var timeout <-chan time.Time
	var budgetTimer *time.Timer // armed while w waits in capQ for its tenant's budget only
	defer func() {
		if budgetTimer != nil {
			budgetTimer.Stop()
		}
	}()
	var refilled <-chan time.Time
	var ctxErr error       // ctx's error as last read, outside the lock
	var waitedIn waitStage // the stage w was last seen waiting in
	for w.stage != stageDone {
		waitedIn = w.stage
		if w.stage == stageCluster {
			ctxErr = g.askClusterLocked(ctx, w, d)
			continue
		}
		// Parked in capQ or globalQ.
		if w.stage == stageCap && w.deadline != 0 {
			if !w.expired && timer == nil {
				if left := time.Duration(w.deadline - g.nowLocked()); left > 0 {
					timer = time.NewTimer(left)
					timeout = timer.C
				} else {
					w.expired = true
				}
			}
			if w.expired {
				g.failLocked(w, TimedOut, g.refusalLocked(w.l, g.nowLocked()-w.enqueued))
				continue
			}
		}
		if w.stage == stageCap && refilled == nil && (w.t.plan.Budget.Rate > 0 || w.l.class.Budget.Rate > 0) {
			// Nothing is released when a budget refills: w's goroutine
			// looks again when both its tenant's and its class's allow
			// the next request.
			now := g.nowLocked()
			if d := max(g.budgetWaitLocked(w.t, pendingSlots(w.t), now), g.classBudgetWaitLocked(w.l, now)); d > 0 {
				if budgetTimer == nil {
					budgetTimer = time.NewTimer(d)
				} else {
					budgetTimer.Reset(d)
				}
				refilled = budgetTimer.C
			}
		}
		g.mu.Unlock()
		fired, refill := false, false
		select {
		case <-w.wake:
		case <-ctx.Done():
		case <-timeout:
			fired, timeout = true, nil
		case <-refilled:
			refill, refilled = true, nil
		}
		ctxErr = ctx.Err()
		g.mu.Lock()
		switch {
		case w.stage == stageDone || w.stage == stageCluster:
			// Granted, failed or promoted meanwhile: the next turn acts on it.
		case ctxErr != nil:
			waitedIn = w.stage // promoted from capQ to globalQ while parked, perhaps
			g.failLocked(w, ctxOutcome(ctxErr), ctxErr)
		case fired:
			// In capQ the next turn times w out. In globalQ it holds a
			// tenant slot and waits on: MaxWait bounds only the wait for
			// the cap, unless a cut sends it back there.
			w.expired = true
		case refill:
			g.promoteLocked(w.t)
			g.dispatchLocked(w.t.srv)
		case wakeIgnoredHook != nil:
			g.mu.Unlock()
			wakeIgnoredHook()
			g.mu.Lock()
		}
	}
	return g.leaveLocked(w, ctxErr, waitedIn, d)
}

// leaveLocked ends w's admission: it counts the outcome, fills the trace data
// and releases what w does not hand to its caller. A grant that raced the
// caller's cancellation (ctxErr) is given back. A request whose ctx ended
// gets a *WaitError naming waitedIn. It unlocks g.mu.
func (g *Gate) leaveLocked(w *waiter, ctxErr error, waitedIn waitStage, d *TraceAcquireEndData) (Permit, error) {
	t := w.t
	lease := w.lease // a failed request's; a granted one's went to its permit
	w.lease = nil
	g.fillWaitsLocked(w, d)
	if w.err == nil && ctxErr != nil {
		// Rather than hand a permit to a caller that has gone.
		g.letLocked(t, w.l.class, w.permit.s.start)
		w.permit.s.start = 0 // never held: its ~0 hold must not count in RetryAfter's average
		_, lease = g.releaseLocked(w.permit.s, false)
		w.permit, w.outcome, w.err = Permit{}, ctxOutcome(ctxErr), ctxErr
	}
	g.countLocked(t, w.l, w.l.class, w.outcome)
	g.mu.Unlock()
	releaseLease(lease)
	d.Outcome = w.outcome
	if w.outcome == TimedOut || w.outcome == Cancelled {
		if err, ok := w.err.(*OverLimitError); ok {
			return Permit{}, err
		}
		e := &WaitError{Tenant: t.id, Stage: waitedIn.public(), Waited: time.Duration(w.done - w.enqueued), Err: w.err}
		if w.l.class.index != 0 {
			e.Class = w.l.class.name
		}
		return Permit{}, e
	}
	return w.permit, w.err
}

// failLocked takes w out of its stage with outcome o and error err, giving
// back the tenant slot it held, if any.
func (g *Gate) failLocked(w *waiter, o Outcome, err error) {
	t, l := w.t, w.l
	switch w.stage {
	case stageCap:
		l.capQ.remove(&w.qlink)
	case stageGlobal:
		l.globalQ.remove(&w.qlink)
		g.fixLinesLocked(t)
		fallthrough
	case stageCluster: // its caller counted it out of clusterPending
		g.promoteLocked(t)
		g.dispatchLocked(t.srv) // for a promoted request that kept its cluster lease
	}
	now := g.nowLocked()
	g.waiting--
	l.class.waiting--
	w.endLocked(o, err, now)
	if t.next != nil {
		g.settleLocked(t)
	}
	if t.isIdle() {
		g.markIdleLocked(t, now)
	}
}

// takeLocked counts one permit of class c granted to t.
func (g *Gate) takeLocked(t *tenant, c *classState) {
	if grantHook != nil {
		grantHook(g, t, c)
	}
	if t.inUse < t.reserved {
		t.srv.reservedFree--
	}
	t.inUse++
	inDefault := t.inUse
	if t.wait != nil {
		l := &t.wait.lanes[c.index]
		l.inUse++
		inDefault = t.wait.lanes[0].inUse
	}
	if t.ad != nil && c.index == 0 {
		t.ad.granted(inDefault)
	}
	c.used++
	t.srv.classes[c.index].used++
	t.srv.used++
	g.used++
}

// grantWaiterLocked hands a permit, already counted by takeLocked, to w.
func (g *Gate) grantWaiterLocked(w *waiter, now int64) {
	p := g.newPermitLocked(w.t, w.l.class, now)
	p.s.start, p.s.weight = now, 1
	g.heldLocked(w.t, w.l.class, now)
	p.s.lease, w.lease = w.lease, nil
	w.permit = p
	g.waiting--
	w.l.class.waiting--
	w.endLocked(Acquired, nil, now)
}

// countLocked counts one admission of t, of class c (in lane l, nil for
// the default class of a tenant without contention state), that ended with
// outcome o.
func (g *Gate) countLocked(t *tenant, l *lane, c *classState, o Outcome) {
	if o < Failed {
		t.outcomes[o]++
		g.totals.outcomes[o]++
		c.outcomes[o]++
		if l != nil {
			l.outcomes[o]++
		}
	}
}

// overLimitLocked is the error for a request of lane l refused after
// waiting waited ns (0 when refused on arrival). Its Limit is the class's
// cap when the lane is full, else the tenant's.
func (g *Gate) overLimitLocked(l *lane, waited int64) *OverLimitError {
	t := l.t
	e := &OverLimitError{Tenant: t.id, Limit: t.cap, RetryAfter: g.retryAfterLocked(l), Waited: time.Duration(waited)}
	if l.class.index != 0 {
		e.Class = l.class.name
		if limit := g.laneLimitLocked(l); l.held() >= limit {
			e.Limit = limit
		}
	}
	return e
}

// refusalLocked is the error for a request of lane l refused in the tenant
// stage after waiting waited ns (0 when refused on arrival): a budget's
// (the tenant's or its class's, see budgetRefusalLocked) when the lane's
// and the tenant's caps had room, else overLimitLocked's.
func (g *Gate) refusalLocked(l *lane, waited int64) *OverLimitError {
	t := l.t
	if t.plan.Budget.Rate == 0 && l.class.Budget.Rate == 0 || l.held() >= g.laneLimitLocked(l) || t.held() >= t.cap {
		return g.overLimitLocked(l, waited)
	}
	b, wait := g.budgetRefusalLocked(l, g.nowLocked())
	e := &OverLimitError{Tenant: t.id, Limit: t.cap, Waited: time.Duration(waited), Cause: CauseBudget,
		RetryAfter: min(max(wait, time.Millisecond), g.cfg.MaxRetryAfter)}
	if l.class.index != 0 {
		e.Class = l.class.name
	}
	b.refused++
	return e
}

func ctxOutcome(err error) Outcome {
	if err == context.DeadlineExceeded {
		return TimedOut
	}
	return Cancelled
}

// fillWaitsLocked records w's wait in the trace data and the wait totals.
func (g *Gate) fillWaitsLocked(w *waiter, d *TraceAcquireEndData) {
	end := w.done
	if end == 0 {
		end = g.lastNow
	}
	// The three waits add up to the whole: a request sent back to the cap
	// after asking the cluster counts that time once, as cluster wait.
	waited := end - w.enqueued
	var global int64
	if w.promoted != 0 {
		global = max(0, end-w.promoted-w.clusterWait)
	}
	d.GlobalWait = time.Duration(global)
	d.ClusterWait = time.Duration(w.clusterWait)
	d.TenantWait = time.Duration(max(0, waited-global-w.clusterWait))
	w.t.waitTotal += waited
	w.l.waitTotal += waited
	w.l.class.waitTotal += waited
	g.totals.waitTotal += waited
}

// releaseLease returns a cluster lease, if there is one.
func releaseLease(l ClusterLease) {
	if l != nil {
		l.Release()
	}
}
