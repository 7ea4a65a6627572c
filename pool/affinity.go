package pool

// Affinity. What a permit stands for may stay warm for its tenant: with
// tenantdb's Config.Database, the connection a call used stays open to the
// tenant's database, and another database can have it only by a close and a
// connect, which cost hundreds of times a short statement. So when a permit
// is released while others wait for its server's capacity, the unit it
// returns goes to its own tenant's next request of the same class, if one
// waits for shared capacity, ahead of the fair order: up to Config.Affinity
// such grants in a row on a server, after which the next unit goes in the
// fair order (dispatchLocked, which starts the count again). A request
// whose turn it is waits for at most Affinity grants more than it would
// without. Affinity changes the order, not the shares: a lane runs at most
// Affinity grants ahead of its turns, and pays each back with one of its
// next turns in the ring, which goes to the next lane instead
// (fairRing.next). Reserved lines, a class below its MinShare and a tenant
// with a placement to take are never passed. Affinity is a parameter of
// the shared stage, as a class is: one admission loop still.

// affineLocked grants the unit that a permit of tenant t and class c just
// returned to t's next request of c waiting for shared capacity, when
// Config.Affinity allows it and the fair order may serve another first.
func (g *Gate) affineLocked(t *tenant, c *classState) {
	s := t.srv
	if s.affine >= g.cfg.Affinity || t.wait == nil || t.next != nil { // Affinity <= 0: never
		return
	}
	l := &t.wait.lanes[c.index]
	if l.globalQ.n == 0 || l.affine >= g.cfg.Affinity || !g.grantableLocked(t, c) {
		return
	}
	if sc := s.classes[c.index]; sc.ring.cursor == l && l.credit > 0 {
		return // its turn in the fair order, which dispatchLocked serves (or pays back)
	}
	for i, o := range s.classes {
		if o.reserved.head != nil && o.used < o.share {
			return // a reserved line goes first
		}
		if i != 0 && i != int(c.index) && o.used < o.keep && o.ring.cursor != nil {
			return // so does a class below its MinShare
		}
	}
	s.affine++
	l.affine++
	w := l.globalQ.popFront()
	g.takeLocked(t, c)
	g.fixLinesLocked(t)
	g.grantWaiterLocked(w, g.nowLocked())
}
