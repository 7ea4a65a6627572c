package pool

// Idle tenants are removed so that memory does not grow with every tenant ever
// seen. A tenant becomes idle when nothing of it is in use or waiting. The
// uncontended path does not read the clock (it costs more than the rest of
// that path), so a tenant that goes idle without a clock reading at hand joins
// the fresh list unstamped; a later sweep, which has the time, stamps it and
// moves it to the idle list, which is therefore ordered by stamp. Sweeps run on
// the sampled uncontended acquires, on new tenants and in EvictIdle, each
// looking at a bounded number of tenants. A tenant is thus evicted no sooner
// than IdleTTL after it went idle.

// A tenant that is busy again leaves the fresh list lazily: it stays linked,
// marked busyInFresh, until a sweep or makeRoomLocked meets it, so that the
// uncontended path, where a tenant goes idle and busy again with every
// request, only flips a mark. It leaves the idle list (stamped) at once.
const (
	notIdle     uint8 = iota
	inFresh           // idle, on the fresh list, not stamped yet
	inIdle            // idle, on the idle list, stamped
	busyInFresh       // busy, still linked on the fresh list
)

// markIdleLocked records that t went idle; now is a fresh clock reading, or 0
// when none is at hand. A tenant already on an idle list stays where it is.
func (g *Gate) markIdleLocked(t *tenant, now int64) {
	switch t.idleList {
	case inFresh, inIdle:
		return
	case busyInFresh:
		t.idleList = inFresh // a later sweep stamps it, no earlier than now
	case notIdle:
		if now != 0 {
			t.idleSince, t.idleList = now, inIdle
			g.idle.pushBack(&t.idleLink)
		} else {
			t.idleList = inFresh
			g.fresh.pushBack(&t.idleLink)
		}
	}
	if t.wait != nil {
		for i := range t.wait.lanes {
			t.wait.lanes[i].credit = 0 // a turn in the fair ring does not outlive the backlog
		}
	}
}

// unidleLocked records that t is busy again.
func (g *Gate) unidleLocked(t *tenant) {
	switch t.idleList {
	case inFresh:
		t.idleList = busyInFresh
	case inIdle:
		g.idle.remove(&t.idleLink)
		t.idleList = notIdle
	}
}

// dropBusyFreshLocked unlinks the busy tenants at the head of the fresh
// list. Each was linked once, when it went idle, so this is O(1) amortized.
func (g *Gate) dropBusyFreshLocked() {
	for t := g.fresh.front(); t != nil && t.idleList == busyInFresh; t = g.fresh.front() {
		g.fresh.remove(&t.idleLink)
		t.idleList = notIdle
	}
}

// sweepLocked stamps unstamped idle tenants and evicts expired ones, looking at
// no more than budget tenants of each kind. It reports whether it stopped for
// the budget with work left.
func (g *Gate) sweepLocked(now int64, budget int) (more bool) {
	for i := 0; i < budget && g.fresh.head != nil; i++ {
		t := g.fresh.popFront()
		if t.idleList == busyInFresh {
			t.idleList = notIdle
			continue
		}
		t.idleSince, t.idleList = now, inIdle
		g.idle.pushBack(&t.idleLink)
	}
	ttl := int64(g.cfg.IdleTTL)
	for i := 0; i < budget; i++ {
		t := g.idle.front()
		if t == nil || now-t.idleSince < ttl {
			return g.fresh.head != nil
		}
		g.evictLocked(t)
	}
	return true
}

// evictLocked forgets an idle tenant.
func (g *Gate) evictLocked(t *tenant) {
	if t.idleList == inIdle {
		g.idle.remove(&t.idleLink)
	} else {
		g.fresh.remove(&t.idleLink)
	}
	t.idleList = notIdle
	delete(g.tenants, t.id)
	if g.recent == t {
		g.recent = nil
	}
	g.evicted++
	if t.reserved > 0 { // inUse is 0: the whole reservation was kept free
		g.unreserveLocked(t)
		g.dispatchLocked(t.srv)
	}
}

// makeRoomLocked makes room for one more tenant at Config.MaxTenants: it
// sweeps, and if that freed nothing evicts the longest-idle tenant early.
// It reports false when every tracked tenant is busy.
func (g *Gate) makeRoomLocked(now int64) bool {
	g.sweepLocked(now, sweepBudget)
	if len(g.tenants) < g.cfg.MaxTenants {
		return true
	}
	t := g.idle.front()
	if t == nil {
		g.dropBusyFreshLocked()
		t = g.fresh.front()
	}
	if t == nil {
		return false
	}
	g.evictLocked(t)
	return true
}

// EvictIdle removes every tenant that has been idle for Config.IdleTTL or
// longer and returns how many it removed. Tenants that went idle since the last
// sweep are stamped now and removed by a later call. It works adminBatch
// tenants per hold of the lock, so admissions go on while it clears a flood of
// idle tenants; call it from a background ticker, not per request.
func (g *Gate) EvictIdle() int {
	evicted := 0
	g.mu.Lock()
	// Bounded by the tenants there are now, so tenants going idle meanwhile
	// cannot keep it running.
	rounds := (g.fresh.n+g.idle.n)/adminBatch + 1
	now := g.nowLocked()
	for {
		before := g.evicted
		more := g.sweepLocked(now, adminBatch)
		evicted += int(g.evicted - before)
		if rounds--; !more || rounds < 0 {
			break
		}
		g.mu.Unlock()
		if adminBatchHook != nil {
			adminBatchHook()
		}
		g.mu.Lock()
	}
	g.shrinkLocked()
	g.mu.Unlock()
	return evicted
}

// shrinkLocked rebuilds the tenants map once it holds under a quarter of its
// peak: Go maps never give back their buckets, so after a flood of tenants has
// been evicted the empty map would otherwise keep the flood's memory. The
// copy is of the remaining quarter at most; forEachTenant copes with the map
// being replaced under it.
func (g *Gate) shrinkLocked() {
	n := len(g.tenants)
	if n > g.tenantsPeak {
		g.tenantsPeak = n
	}
	if g.tenantsPeak < 1024 || n >= g.tenantsPeak/4 {
		return
	}
	m := make(map[string]*tenant, n)
	for id, t := range g.tenants {
		m[id] = t
	}
	g.tenants, g.tenantsPeak = m, n
}
