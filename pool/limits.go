package pool

import (
	"fmt"
	"time"
)

// SetTenantLimit overrides tenantID's cap at runtime, above its plan's and any
// Lookup override; n == 0 removes the override. A raise serves waiting
// requests at once; a cut revokes nothing, new grants wait until the tenant
// is below it. Overrides are kept for tenants not tracked yet and survive
// idle eviction, so their number grows only with the calls made.
func (g *Gate) SetTenantLimit(tenantID string, n int) error {
	if err := validateID(tenantID, g.cfg.MaxTenantIDLen); err != nil {
		return err
	}
	if capacity := g.cfg.tenantCapacity(); n < 0 || n > capacity {
		return fmt.Errorf("%w: tenant %q limit %d outside 0 to capacity %d", ErrInvalidConfig, tenantID, n, capacity)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if n == 0 {
		delete(g.overrides, tenantID)
	} else {
		g.overrides[tenantID] = n
	}
	if t := g.tenants[tenantID]; t != nil {
		g.applyLimitLocked(t)
	}
	return nil
}

// SetPlan adds a plan or changes one at runtime; tenants on it take the new
// limits, weight and reservation as SetTenantLimit describes: a tenant's next
// request sees them at once, and tenants already waiting are re-served here.
// It visits every tracked tenant, adminBatch of them per hold of the lock, so
// admissions go on meanwhile even with 100,000 tenants tracked; it is for
// administrative changes, not per request.
func (g *Gate) SetPlan(name string, p Plan) error {
	if err := p.validate(name, g.cfg.tenantCapacity(), g.cfg.MaxReserved); err != nil {
		return err
	}
	if err := validateClassConns(name, p, g.classes); err != nil {
		return err
	}
	if p.Budget.Rate > 0 {
		g.budgets.Store(true)
	}
	g.mu.Lock()
	ps := g.plans[name]
	if ps == nil {
		g.plans[name] = newPlanState(name, p, g.classes)
		g.mu.Unlock()
		return nil
	}
	ps.Plan, ps.weight, ps.classCaps, ps.burst = p, max(1, p.Weight), classCaps(p, g.classes), p.Budget.burst()
	ps.version++
	g.mu.Unlock()
	g.forEachTenant(func(t *tenant) {
		if t.plan == ps && t.planVersion != ps.version {
			g.applyLimitLocked(t)
		}
	})
	return nil
}

// forEachTenant calls f, under the lock, for every tenant tracked for the
// whole call, releasing the lock after every adminBatch tenants. Tenants
// created meanwhile may or may not be visited; tenants evicted meanwhile are
// not.
func (g *Gate) forEachTenant(f func(t *tenant)) {
	g.mu.Lock()
	m, i := g.tenants, 0
	for id, t := range m { // Go maps may be changed during a range; the lock orders every access
		if g.tenants[id] != t {
			continue // evicted while the lock was released (m may be a replaced map)
		}
		f(t)
		if i++; i%adminBatch == 0 {
			g.mu.Unlock()
			if adminBatchHook != nil {
				adminBatchHook()
			}
			g.mu.Lock()
		}
	}
	g.mu.Unlock()
}

// InvalidateTenant drops tenantID's cached Lookup answer, or its cached
// Lookup failure, so that its next request asks Lookup again (for example
// after its plan changed, or its account was created).
func (g *Gate) InvalidateTenant(tenantID string) {
	g.mu.Lock()
	g.failed.forgetLocked(tenantID)
	if t := g.tenants[tenantID]; t != nil {
		t.resolvedAt = -int64(g.cfg.LookupTTL) - 1
	}
	g.mu.Unlock()
}

// applyLimitLocked recomputes t's cap (runtime override, then Lookup's, then
// the plan's) and reservation, and serves what that makes possible.
func (g *Gate) applyLimitLocked(t *tenant) {
	limit := t.plan.MaxConns
	if t.lookupMax > 0 {
		limit = t.lookupMax
	}
	if o, ok := g.overrides[t.id]; ok {
		limit = o
	}
	t.cap = limit
	t.limit = limit
	t.limits = t.ownTimeLimits()
	if g.cfg.Adaptive.Enabled {
		if t.ad == nil {
			t.ad = newAdaptiveLimit(g.adaptiveFloorLocked(t), g.nowLocked())
		}
		t.limit = t.ad.bound(g.adaptiveFloorLocked(t), limit)
	}
	if t.move != nil {
		t.cap, t.limit = 0, 0 // draining: nothing more is granted until Resume
	}
	t.planVersion = t.plan.version
	g.demoteLocked(t)
	g.reserveLocked(t)
	g.promoteLocked(t)
	g.dispatchLocked(t.srv)
}

// demoteLocked, after a cut, hands back tenant slots that requests waiting for
// global capacity hold beyond the new limits: in each lane over its limit,
// and then, while the tenant is over its cap, in the named classes' lanes
// before the default class's, the latest of them go back, in order, to the
// front of their lane's queue for a slot, and are woken to keep their
// MaxWait deadline there. Permits in use are never revoked.
func (g *Gate) demoteLocked(t *tenant) {
	c := t.wait
	if c == nil {
		return
	}
	held := t.held()
	for i := len(c.lanes) - 1; i >= 0; i-- {
		l := &c.lanes[i]
		limit := g.laneLimitLocked(l)
		for l.globalQ.n > 0 && (l.held() > limit || held > t.cap) {
			demote(l)
			held--
		}
	}
	g.fixLinesLocked(t)
}

// demote sends l's latest request waiting for global capacity back to the
// front of its queue for a slot.
func demote(l *lane) {
	w := l.globalQ.tail.v
	l.globalQ.remove(&w.qlink)
	w.stage, w.promoted = stageCap, 0
	l.capQ.pushFront(&w.qlink)
	w.signal()
}

// reserveLocked brings t's reservation in force to min(plan.ReservedConns,
// cap) if the reservations in force still fit in Config.MaxReserved, and to
// nothing if they do not (all or nothing, so a reservation means what it says).
func (g *Gate) reserveLocked(t *tenant) {
	want := min(t.plan.ReservedConns, t.cap)
	if want == t.reserved {
		return
	}
	g.unreserveLocked(t)
	s := t.srv
	if s.reservedTotal+want <= s.maxReserved {
		t.reserved, t.reservationDenied = want, false
	} else if !t.reservationDenied {
		t.reservationDenied = true
		g.resDenied++
	}
	s.reservedFree += max(0, t.reserved-t.inUse)
	s.reservedTotal += t.reserved
	g.fixLinesLocked(t)
}

// retryAfterLocked estimates when l's tenant will next have a free slot
// for its class: the class's average hold time (the tenant's, before one is
// measured) for every round of its limit that its waiting requests need.
func (g *Gate) retryAfterLocked(l *lane) time.Duration {
	t := l.t
	hold, waiting, limit := time.Duration(t.avgHold), t.waiting(), t.limit
	if len(g.classes) > 1 {
		if l.avgHold > 0 {
			hold = time.Duration(l.avgHold)
		}
		waiting, limit = l.waiting(), g.laneLimitLocked(l)
	}
	if hold <= 0 {
		hold = unknownHold
	}
	d := hold * time.Duration(waiting/max(1, limit)+1)
	return min(max(d, time.Millisecond), g.cfg.MaxRetryAfter)
}

// adaptiveFloorLocked is the lowest effective limit Config.Adaptive may give
// t: MinConns, raised to the plan's reservation so that it stays usable, and
// never above t's cap.
func (g *Gate) adaptiveFloorLocked(t *tenant) int {
	return min(t.cap, max(g.cfg.Adaptive.MinConns, t.plan.ReservedConns))
}

// heldLocked tells t's controller, if any, that t holds a permit of class c
// granted at start; only the default class drives it (see releaseLocked).
func (g *Gate) heldLocked(t *tenant, c *classState, start int64) {
	if t.ad != nil && c.index == 0 {
		t.ad.held(start)
	}
}

// letLocked tells t's controller, if any, that the permit of class c granted
// at start was given back without being held (see leaveLocked).
func (g *Gate) letLocked(t *tenant, c *classState, start int64) {
	if t.ad != nil && c.index == 0 && start != 0 {
		t.ad.let(start)
	}
}

// adaptLocked feeds t's controller one released permit of the default
// class, of which t still holds inUse, tells it when t has none of that
// class held or waiting, and applies the limit it answers. A
// cut sends requests holding a tenant slot above it back to wait for the cap
// (as SetTenantLimit does) and revokes no permit; a rise is served by the
// caller's promoteLocked.
func (g *Gate) adaptLocked(t *tenant, start, hold, now int64, inUse int) {
	floor := g.adaptiveFloorLocked(t)
	limit := t.ad.observe(start, hold, now, inUse, &g.cfg.Adaptive, floor, t.cap)
	if inUse == 0 && (t.wait == nil || t.wait.lanes[0].waiting() == 0) {
		limit = t.ad.emptied(now, floor, t.cap)
	}
	if limit == t.limit {
		return
	}
	cut := limit < t.limit
	t.limit = limit
	if cut {
		g.demoteLocked(t)
	}
}
