package pool

import (
	"context"
	"time"
)

// Permit is a granted admission: one of its tenant's slots and one unit of
// global capacity, both returned by Release. It is a small value: copies refer
// to the same admission, and releasing any of them releases it once. The zero
// Permit is valid; its Release does nothing.
type Permit struct {
	s   *permitState
	gen uint64
}

// permitState is the Gate's record of a granted permit. Released states are
// reused (the Gate keeps a free list, never longer than its capacity), so the
// uncontended path allocates nothing; gen tells a stale Permit from the
// current holder, which is what makes Release idempotent.
type permitState struct {
	g            *Gate
	t            *tenant         // guarded by g.mu
	class        *classState     // guarded by g.mu
	gen          uint64          // guarded by g.mu: bumped on every release
	ctx          context.Context // the tracer's context, nil without a tracer
	start        int64           // guarded by g.mu: clock at grant, 0 if hold time is not measured
	weight       int64           // guarded by g.mu: how many permits a measured hold stands for
	lease        ClusterLease    // guarded by g.mu: the cluster-wide slot, nil without Config.Cluster
	limits       timeLimits      // set at grant, before the holder sees the permit: its time limits
	place        *placed         // set at grant, as limits: its tenant's placement then
	charged      int64           // guarded by g.mu: ns its grant charged to its tenant's budget
	classCharged int64           // guarded by g.mu: ns its grant charged to its class's budget (Class.Budget)
	next         *permitState    // guarded by g.mu: in the free list
}

// Release returns the permit's tenant slot and global capacity, and serves
// whoever waits for them. Only the first Release of a permit (or of any copy
// of it) has an effect, so a deferred Release next to an explicit one is safe.
func (p Permit) Release() {
	s := p.s
	if s == nil {
		return
	}
	g := s.g
	g.mu.Lock()
	if s.gen != p.gen {
		g.mu.Unlock()
		return
	}
	tctx := s.ctx
	var rd TraceReleaseData
	if g.releaseTracer != nil {
		rd.Tenant, rd.Plan, rd.Budgeted = s.t.id, s.t.plan.name, s.charged != 0 || s.t.plan.Budget.Rate > 0
		if s.class.index != 0 {
			rd.Class = s.class.name
		}
	}
	hold, lease := g.releaseLocked(s, true)
	g.mu.Unlock()
	releaseLease(lease)
	if g.releaseTracer != nil {
		rd.Hold = time.Duration(hold)
		g.releaseTracer.TraceRelease(tctx, g, rd)
	}
}

// Revoked returns a channel closed when the permit's cluster lease is
// revoked (see ClusterLease): the tenant's cluster-wide slot may be held by
// another process now, and the holder should stop the work it admits. It is
// nil, never closed, when the permit has no revocable lease (no
// Config.Cluster, a limiter that never revokes, a local lease) or was
// released.
func (p Permit) Revoked() <-chan struct{} {
	s := p.s
	if s == nil || s.g.cfg.Cluster == nil { // Cluster never changes after New: no lock on the common path
		return nil
	}
	g := s.g
	g.mu.Lock()
	var lease ClusterLease
	if s.gen == p.gen {
		lease = s.lease
	}
	g.mu.Unlock()
	if r, ok := lease.(revocable); ok {
		return r.Revoked()
	}
	return nil
}

// releaseLocked returns s's slot and capacity, serves whoever waits for them
// (its own tenant first, by Config.Affinity, when warm says its holder used
// it) and recycles s. It returns the measured hold time (0 if not measured)
// and the cluster lease to release once unlocked.
func (g *Gate) releaseLocked(s *permitState, warm bool) (hold int64, lease ClusterLease) {
	t, c := s.t, s.class
	var l *lane
	if t.wait != nil {
		l = &t.wait.lanes[c.index]
	}
	var now int64
	start := s.start
	if s.start != 0 {
		now = g.nowLocked()
		hold = now - s.start
		t.holdTotal += hold * s.weight
		c.holdTotal += hold * s.weight
		g.totals.holdTotal += hold * s.weight
		t.avgHold = movingAverage(t.avgHold, hold)
		if l != nil {
			l.holdTotal += hold * s.weight
			l.avgHold = movingAverage(l.avgHold, hold)
		}
	}
	if b := t.bucket; b != nil {
		if s.weight == 0 { // not timed: it costs what its grant was charged (chargeReleaseLocked)
			b.used += s.charged
		} else {
			g.chargeReleaseLocked(t, s, hold, now)
		}
	}
	if l != nil && l.bucket != nil {
		g.chargeClassReleaseLocked(l, s, hold, now)
	}
	s.gen++
	lease = s.lease
	s.t, s.class, s.ctx, s.start, s.weight, s.lease, s.charged, s.place = nil, nil, nil, 0, 0, nil, 0, nil
	s.next, g.freePermits = g.freePermits, s

	t.inUse--
	c.used--
	t.srv.classes[c.index].used--
	t.srv.used--
	g.used--
	inDefault := t.inUse
	if l != nil {
		l.inUse--
		inDefault = t.wait.lanes[0].inUse
	}
	if t.inUse < t.reserved {
		t.srv.reservedFree++
	}
	if t.ad != nil && start != 0 && c.index == 0 {
		// Only the default class's holds drive the adaptive limit, which
		// bounds that class only: classes whose statements take fifty
		// times longer would read as inflation.
		g.adaptLocked(t, start, hold, now, inDefault)
	}
	if g.waiting > 0 { // else no one could be promoted or served
		if t.wait != nil {
			g.fixLinesLocked(t)
			g.promoteLocked(t)
		}
		if warm {
			g.affineLocked(t, c)
		}
		g.dispatchLocked(t.srv)
	}
	if t.next != nil {
		g.settleLocked(t)
	}
	if t.move != nil {
		g.drainedLocked(t)
	}
	if t.isIdle() {
		g.markIdleLocked(t, now)
	}
	return hold, lease
}

// movingAverage folds one hold time into an average of them.
func movingAverage(avg, hold int64) int64 {
	if avg == 0 {
		return hold
	}
	return avg + (hold-avg)/8
}

// newPermitLocked returns a permit of class c for t, granted at now (0 if
// not read), reusing a released state if any.
func (g *Gate) newPermitLocked(t *tenant, c *classState, now int64) Permit {
	s := g.freePermits
	if s != nil {
		g.freePermits, s.next = s.next, nil
	} else {
		s = &permitState{g: g}
	}
	s.t, s.class, s.limits, s.place = t, c, t.timeLimits(c), t.place
	g.chargeGrantLocked(t, c, s, now)
	return Permit{s: s, gen: s.gen}
}
