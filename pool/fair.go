package pool

// The fair global gate. Requests that hold a tenant slot and wait for global
// capacity sit in their tenant's globalQ. Tenants with such requests form a
// ring that is served in weighted round-robin order: the tenant under the
// cursor gets up to its plan's Weight grants in a turn, then the cursor moves
// on. A tenant with one waiter and one with a thousand therefore alternate
// (weights aside), instead of being served first come, first served.
//
// A tenant whose globalQ empties leaves the ring, but while it is still
// backlogged (requests wait for its own cap, or for the cluster) it keeps the
// credit left in its turn, and on its return it resumes that turn at the
// cursor. Without this, a tenant whose own cap lets only one request at a time
// reach the global queue would leave the ring after every grant and lose its
// weight: weights would hold only for tenants with caps above their share.
//
// Reservations come before the ring. A tenant below its reservation with a
// waiting request is in the reserved line, which is served first; and no
// grant to anyone else may leave fewer free units than the reservations not
// yet taken (Gate.reservedFree). So a reserved tenant never waits behind other
// tenants for capacity kept for it.

// fairRing is the ring of tenants with global waiters, kept as a list in
// ring order, plus a cursor. Each tenant's credit (grants left in its turn)
// is in its contention state.
type fairRing struct {
	l      list[tenant]
	cursor *tenant // nil when the ring is empty
}

// add puts t in the ring: at the cursor when it resumes an interrupted turn,
// else at the end of the round, just before the cursor.
func (r *fairRing) add(t *tenant) {
	c := t.wait
	c.inRing = true
	if r.cursor == nil {
		r.l.pushBack(&c.ringLink)
		r.cursor = t
		if c.credit <= 0 {
			c.credit = t.plan.weight
		}
		return
	}
	r.l.insertBefore(&c.ringLink, &r.cursor.wait.ringLink)
	if c.credit > 0 {
		r.cursor = t // the cursor's own turn goes on after t's, credit intact
	}
}

// remove takes t out of the ring. It keeps its credit when backlogged says it
// will be back.
func (r *fairRing) remove(t *tenant, backlogged bool) {
	c := t.wait
	c.inRing = false
	if !backlogged {
		c.credit = 0
	}
	if r.l.n == 1 {
		r.cursor = nil
	} else if r.cursor == t {
		r.turnTo(r.after(t))
	}
	r.l.remove(&c.ringLink)
}

// after returns the tenant after t in ring order.
func (r *fairRing) after(t *tenant) *tenant {
	if e := t.wait.ringLink.next; e != nil {
		return e.v
	}
	return r.l.head.v
}

// turnTo moves the cursor to t, starting a turn unless t has one left.
func (r *fairRing) turnTo(t *tenant) {
	r.cursor = t
	if c := t.wait; c.credit <= 0 {
		c.credit = t.plan.weight
	}
}

// next returns the tenant whose turn it is and uses one of its credits, or
// nil when the ring is empty.
func (r *fairRing) next() *tenant {
	if r.cursor == nil {
		return nil
	}
	if r.cursor.wait.credit <= 0 {
		r.turnTo(r.after(r.cursor))
	}
	r.cursor.wait.credit--
	return r.cursor
}

// fixLinesLocked puts t in or out of the ring and the reserved line after its
// globalQ, inUse or reservation changed.
func (g *Gate) fixLinesLocked(t *tenant) {
	c := t.wait
	if c == nil {
		return
	}
	if inRing := c.globalQ.n > 0; inRing != c.inRing {
		if inRing {
			g.ring.add(t)
		} else {
			g.ring.remove(t, c.capQ.n > 0 || t.clusterPending > 0)
		}
	}
	if inRes := c.globalQ.n > 0 && t.inUse < t.reserved; inRes != c.inRes {
		if inRes {
			g.reserved.pushBack(&c.resLink)
		} else {
			g.reserved.remove(&c.resLink)
		}
		c.inRes = inRes
	}
}

// grantableLocked reports whether t may take a unit of global capacity now
// without passing anyone the fair gate would serve first.
func (g *Gate) grantableLocked(t *tenant) bool {
	free := g.cfg.Capacity - g.used
	if free <= 0 {
		return false
	}
	return t.inUse < t.reserved || free-1 >= g.reservedFree
}

// dispatchLocked grants global capacity to waiting requests while there is
// some: reserved line first, then the weighted ring. It keeps the invariant
// that, when it returns, no waiting request could be granted.
func (g *Gate) dispatchLocked() {
	var now int64
	for g.used < g.cfg.Capacity {
		t := g.reserved.front()
		if t == nil {
			if g.cfg.Capacity-g.used-1 < g.reservedFree {
				return // what is free is kept for reservations not yet taken
			}
			if t = g.ring.next(); t == nil {
				return
			}
		}
		if now == 0 {
			now = g.nowLocked()
		}
		w := t.wait.globalQ.popFront()
		g.takeLocked(t)
		g.fixLinesLocked(t)
		g.grantWaiterLocked(w, now)
	}
}

// promoteLocked gives free tenant slots to t's requests waiting over its cap,
// in order. It runs after t's holding drops or its limit rises.
func (g *Gate) promoteLocked(t *tenant) {
	c := t.wait
	if c == nil || c.capQ.n == 0 || t.held() >= t.limit {
		return
	}
	now := g.nowLocked()
	for c.capQ.n > 0 && t.held() < t.limit {
		w := c.capQ.popFront()
		w.promoted = now
		if g.cfg.Cluster != nil && w.lease == nil {
			// Its goroutine asks the cluster, outside the lock.
			w.stage = stageCluster
			t.clusterPending++
			w.signal()
			continue
		}
		w.stage = stageGlobal
		c.globalQ.pushBack(&w.qlink)
	}
	g.fixLinesLocked(t)
}
