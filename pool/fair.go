package pool

import "math"

// The fair global gate. Requests that hold a tenant slot and wait for global
// capacity sit in their lane's globalQ (the lane of their tenant and class).
// Each class has a ring of the lanes with such requests, served in weighted
// round-robin order: the tenant under the cursor gets up to its plan's
// Weight grants in a turn, then the cursor moves on. A tenant with one waiter and one with a thousand therefore alternate
// (weights aside), instead of being served first come, first served.
//
// A lane whose globalQ empties leaves the ring, but while it is still
// backlogged (requests wait for its own cap, or for the cluster) it keeps the
// credit left in its turn, and on its return it resumes that turn at the
// cursor. Without this, a tenant whose own cap lets only one request at a time
// reach the global queue would leave the ring after every grant and lose its
// weight: weights would hold only for tenants with caps above their share.
//
// Which class's ring is served next (nextLaneLocked): a class holding less
// than its MinShare first, then the default class, then the other classes in
// turn; a class at its MaxShare is never served.
//
// Reservations come before the rings. A tenant below its reservation with a
// waiting request is in the reserved line, which is served first; and no
// grant to anyone else may leave fewer free units than the reservations not
// yet taken (Gate.reservedFree). So a reserved tenant never waits behind other
// tenants for capacity kept for it.

// fairRing is the ring of one class's lanes with global waiters, kept as a
// list in ring order, plus a cursor. Each lane's credit (grants left in its
// turn) is in the lane.
type fairRing struct {
	l      list[lane]
	cursor *lane // nil when the ring is empty
}

// add puts l in the ring: at the cursor when it resumes an interrupted turn,
// else at the end of the round, just before the cursor.
func (r *fairRing) add(l *lane) {
	l.inRing = true
	if r.cursor == nil {
		r.l.pushBack(&l.ringLink)
		r.cursor = l
		if l.credit <= 0 {
			l.credit = l.t.plan.weight
		}
		return
	}
	r.l.insertBefore(&l.ringLink, &r.cursor.ringLink)
	if l.credit > 0 {
		r.cursor = l // the cursor's own turn goes on after l's, credit intact
	}
}

// remove takes l out of the ring. It keeps its credit when backlogged says it
// will be back.
func (r *fairRing) remove(l *lane, backlogged bool) {
	l.inRing = false
	if !backlogged {
		l.credit = 0
	}
	if r.l.n == 1 {
		r.cursor = nil
	} else if r.cursor == l {
		r.turnTo(r.after(l))
	}
	r.l.remove(&l.ringLink)
}

// after returns the lane after l in ring order.
func (r *fairRing) after(l *lane) *lane {
	if e := l.ringLink.next; e != nil {
		return e.v
	}
	return r.l.head.v
}

// turnTo moves the cursor to l, starting a turn unless l has one left.
func (r *fairRing) turnTo(l *lane) {
	r.cursor = l
	if l.credit <= 0 {
		l.credit = l.t.plan.weight
	}
}

// next returns the lane whose turn it is and uses one of its credits, or
// nil when the ring is empty. A turn of a lane that took grants by
// affinity pays one of them back instead (affinity.go), so that affinity
// changes the order of grants, not a tenant's share.
func (r *fairRing) next() *lane {
	if r.cursor == nil {
		return nil
	}
	for {
		if r.cursor.credit <= 0 {
			r.turnTo(r.after(r.cursor))
		}
		r.cursor.credit--
		if r.cursor.affine == 0 {
			return r.cursor
		}
		r.cursor.affine-- // each turn pays one back: the loop ends
	}
}

// fixLinesLocked puts t's lanes in or out of their rings and reserved lines
// after a globalQ, t's inUse or its reservation changed.
func (g *Gate) fixLinesLocked(t *tenant) {
	c := t.wait
	if c == nil {
		return
	}
	for i := range c.lanes {
		l := &c.lanes[i]
		sc := t.srv.classes[i]
		if inRing := l.globalQ.n > 0; inRing != l.inRing {
			if inRing {
				sc.ring.add(l)
			} else {
				sc.ring.remove(l, l.capQ.n > 0 || l.clusterPending > 0)
			}
		}
		if inRes := l.globalQ.n > 0 && t.inUse < t.reserved; inRes != l.inRes {
			if inRes {
				sc.reserved.pushBack(&l.resLink)
			} else {
				sc.reserved.remove(&l.resLink)
			}
			l.inRes = inRes
		}
	}
}

// grantableLocked reports whether t may take a unit of its server's
// capacity for work of class c now without passing anyone the fair gate
// would serve first.
func (g *Gate) grantableLocked(t *tenant, c *classState) bool {
	s := t.srv
	free := s.capacity - s.used
	if sc := s.classes[c.index]; free <= 0 || sc.used >= sc.share {
		return false
	}
	return t.inUse < t.reserved || free-1 >= s.reservedFree
}

// dispatchLocked grants server s's capacity to its waiting requests while
// there is some: reserved lines first, then the weighted rings. It keeps the
// invariant that, when it returns, no request waiting for s could be
// granted.
func (g *Gate) dispatchLocked(s *shared) {
	var now int64
	for s.used < s.capacity {
		var l *lane
		for _, c := range s.classes {
			if c.used < c.share && c.reserved.head != nil {
				l = c.reserved.front()
				break
			}
		}
		if l == nil {
			if s.capacity-s.used-1 < s.reservedFree {
				return // what is free is kept for reservations not yet taken
			}
			if l = s.nextLaneLocked(); l == nil {
				return
			}
		}
		if now == 0 {
			now = g.nowLocked()
		}
		s.affine = 0
		w := l.globalQ.popFront()
		g.takeLocked(l.t, l.class)
		g.fixLinesLocked(l.t)
		g.grantWaiterLocked(w, now)
	}
}

// nextLaneLocked picks the class served next and the lane whose turn it is
// in that class's ring, or nil when no class below its MaxShare has
// waiters: a class below its MinShare first (so it never starves), then the
// default class, then the other classes, one grant each in turn.
func (s *shared) nextLaneLocked() *lane {
	named := s.classes[1:]
	for _, c := range named {
		if c.used < c.keep && c.ring.cursor != nil {
			return c.ring.next()
		}
	}
	if c := s.classes[0]; c.ring.cursor != nil {
		return c.ring.next()
	}
	for i := range named {
		c := named[(s.classTurn+i)%len(named)]
		if c.used < c.share && c.ring.cursor != nil {
			s.classTurn = (s.classTurn + i + 1) % len(named)
			return c.ring.next()
		}
	}
	return nil
}

// promoteLocked gives free tenant slots to t's requests waiting over its cap
// or their lane's limit. A named class holding less than its keep inside
// the tenant (tenantKeepLocked) is served first, up to that keep, so that a
// tenant's own busy default class never starves its other classes; then
// the default class's requests, then the other lanes in order. It runs
// after t's holding drops or a limit rises.
func (g *Gate) promoteLocked(t *tenant) {
	c := t.wait
	if c == nil {
		return
	}
	held := t.held()
	if held >= t.cap {
		return
	}
	var now int64
	promote := func(l *lane, limit int) {
		for l.capQ.n > 0 && held < t.cap && l.held() < limit {
			if now == 0 {
				now = g.nowLocked()
			}
			if !g.budgetAllowsLocked(t, held-t.inUse, now) || !g.classBudgetAllowsLocked(l, now) {
				break // its waiters' goroutines look again when it refills
			}
			g.promoteOneLocked(t, l, now)
			held++
		}
	}
	if classKeepInTenant {
		for i := 1; i < len(c.lanes); i++ {
			if l := &c.lanes[i]; l.capQ.n > 0 {
				promote(l, g.tenantKeepLocked(l))
			}
		}
	}
	for i := range c.lanes {
		if l := &c.lanes[i]; l.capQ.n > 0 {
			promote(l, g.laneLimitLocked(l))
		}
	}
	g.fixLinesLocked(t)
}

// classKeepInTenant turns on the keep of named classes inside a tenant;
// a test turns it off to measure the same load without it.
var classKeepInTenant = true

// tenantKeepLocked is how many of its tenant's slots named-class lane l is
// served before the default class while it has requests waiting: the
// class's MinShare of the tenant's cap, at least 1, at most the lane's limit.
func (g *Gate) tenantKeepLocked(l *lane) int {
	keep := max(1, int(math.Floor(l.class.MinShare*float64(l.t.cap)+1e-9)))
	return min(keep, g.laneLimitLocked(l))
}

// promoteOneLocked moves the first of l's requests waiting for a tenant
// slot on to the next stage: the cluster, or global capacity.
func (g *Gate) promoteOneLocked(t *tenant, l *lane, now int64) {
	w := l.capQ.popFront()
	w.promoted = now
	if g.cfg.Cluster != nil && w.lease == nil {
		// Its goroutine asks the cluster, outside the lock.
		w.stage = stageCluster
		l.clusterPending++
		t.clusterPending++
		w.signal()
		return
	}
	w.stage = stageGlobal
	l.globalQ.pushBack(&w.qlink)
}

// laneLimitLocked is how many of its tenant's slots l may take: the
// tenant's effective limit for the default class (its cap, or its adaptive
// limit), the plan's cap for the class (within the tenant's cap) for the
// others. A request also needs the tenant below its cap.
func (g *Gate) laneLimitLocked(l *lane) int {
	t := l.t
	if l.class.index == 0 {
		return t.limit
	}
	return min(t.plan.classCaps[l.class.index], t.cap)
}
