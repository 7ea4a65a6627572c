package redislimit

import (
	"sync/atomic"
	"time"
)

// lease is a cluster slot: a member of its tenant's sorted set, or, when
// local, a grant made without Redis (FailOpen) that Redis never hears of.
type lease struct {
	l        *Limiter
	tenant   string
	member   string // empty when local
	local    bool
	released atomic.Bool
}

// Local reports that the slot was granted without Redis (FailOpen), so only
// the process's own limits apply to it.
func (s *lease) Local() bool { return s.local }

// Release returns the slot. It does no I/O: the lease leaves the renewal set
// at once and is removed from Redis by the background flush, or by the next
// take of the same tenant in this process, whichever comes first; either
// way before that take counts the tenant's slots. It is idempotent. A lease
// found lost by a renewal, or released by Close, is not released again.
func (s *lease) Release() {
	if !s.released.CompareAndSwap(false, true) {
		return
	}
	l := s.l
	if s.local {
		l.c.localHeld.Add(-1)
		return
	}
	l.mu.Lock()
	set := l.held[s.tenant]
	if _, ok := set[s]; !ok {
		l.mu.Unlock()
		return
	}
	delete(set, s)
	l.nheld--
	if len(set) == 0 {
		delete(l.held, s.tenant)
	}
	l.addPendingLocked(s.tenant, pendingRelease{member: s.member, until: l.releaseUntil()})
	closed := l.closed
	l.mu.Unlock()
	if !closed {
		l.kickMaintenance()
	}
}

// pendingRelease is a lease to remove from Redis. until is when it has
// surely expired there (it is no longer renewed), after which a release that
// keeps failing is given up.
type pendingRelease struct {
	member string
	until  time.Time
}

// releaseUntil is the until of a lease released now: the last renewal may
// still be in flight, so a lease may live up to LeaseTTL after it ends.
func (l *Limiter) releaseUntil() time.Time {
	return time.Now().Add(l.cfg.LeaseTTL + l.cfg.OpTimeout)
}

func (l *Limiter) addPendingLocked(tenant string, r ...pendingRelease) {
	l.pending[tenant] = append(l.pending[tenant], r...)
	l.npending += len(r)
}

// claimPendingLocked takes up to maxMembersPerCall of tenant's pending
// releases off the queue, for a take to carry.
func (l *Limiter) claimPendingLocked(tenant string) []pendingRelease {
	p := l.pending[tenant]
	if len(p) == 0 {
		return nil
	}
	if len(p) <= maxMembersPerCall {
		delete(l.pending, tenant)
		l.npending -= len(p)
		return p
	}
	claimed := p[len(p)-maxMembersPerCall:]
	l.pending[tenant] = p[: len(p)-maxMembersPerCall : len(p)-maxMembersPerCall]
	l.npending -= len(claimed)
	return claimed
}
