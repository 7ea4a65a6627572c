package redislimit

import (
	"sync/atomic"
	"time"
)

// lease is a cluster slot: a member of its tenant's sorted set, or, when
// local, a grant made without Redis (FailOpen) that Redis does not vouch for.
type lease struct {
	l      *Limiter
	tenant string
	member string // empty for a local grant not yet asserted in Redis
	// local is set for FailOpen grants, and when a FailOpen lease is found
	// lost; cleared when reconcile asserts a local grant in Redis.
	local    atomic.Bool
	released atomic.Bool
	// done is closed when the lease is revoked (FailClosed only: a FailOpen
	// lease that Redis no longer vouches for turns local instead); nil in
	// FailOpen, where it is never closed.
	done chan struct{}

	// validUntil is when the lease may have expired in Redis, on this
	// process's monotonic clock: the send time of the last take or renewal
	// that Redis confirmed, plus LeaseTTL, less margin. Redis
	// reads its clock after the request was sent, so its expiry is later.
	validUntil time.Time   // guarded by l.mu
	expiry     *time.Timer // guarded by l.mu: revokes the lease at validUntil
}

// Local reports that the slot was granted without Redis (FailOpen), or that
// Redis stopped vouching for it while it was held (FailOpen), so only the
// process's own limits apply to it.
func (s *lease) Local() bool { return s.local.Load() }

// Revoked returns a channel closed when the lease is revoked: Redis can no
// longer vouch for it (a renewal found it gone, or it was not renewed in
// time: the process was cut off from Redis, paused, or Redis hung) and may
// have given its slot to another process. Only in FailClosed mode; in
// FailOpen mode it returns nil (never closed) and a lease Redis no longer
// vouches for turns local instead (Local then reports true).
func (s *lease) Revoked() <-chan struct{} { return s.done }

// A lease is revocable in the sense of pool.ClusterLease: Permit.Revoked finds this method.
var _ interface{ Revoked() <-chan struct{} } = (*lease)(nil)

// revoked reports whether the lease was revoked.
func (s *lease) revoked() bool {
	if s.done == nil {
		return false
	}
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Release returns the slot. It does no I/O: the lease leaves the renewal set
// at once and is removed from Redis by the background flush, or by the next
// take of the same tenant in this process, whichever comes first; either
// way before that take counts the tenant's slots. It is idempotent. A lease
// that was revoked, or released by Close, is not released again.
func (s *lease) Release() {
	if !s.released.CompareAndSwap(false, true) {
		return
	}
	l := s.l
	l.mu.Lock()
	if s.expiry != nil {
		s.expiry.Stop()
	}
	if _, ok := l.locals[s]; ok {
		delete(l.locals, s)
		l.mu.Unlock()
		l.c.localHeld.Add(-1)
		return
	}
	set := l.held[s.tenant]
	if _, ok := set[s]; !ok {
		l.mu.Unlock()
		return
	}
	l.dropHeldLocked(s)
	l.addPendingLocked(s.tenant, pendingRelease{member: s.member, until: l.releaseUntil()})
	closed := l.closed
	l.mu.Unlock()
	if !closed {
		l.kickMaintenance()
	}
}

// holdLocked registers s, confirmed by Redis for a request sent at sent, for
// renewal, and arms its expiry.
func (l *Limiter) holdLocked(s *lease, sent time.Time) {
	set := l.held[s.tenant]
	if set == nil {
		set = make(map[*lease]struct{})
		l.held[s.tenant] = set
	}
	set[s] = struct{}{}
	l.nheld++
	s.validUntil = sent.Add(l.validity)
	d := time.Until(s.validUntil)
	if s.expiry == nil {
		s.expiry = time.AfterFunc(d, func() { l.expire(s) })
	} else {
		s.expiry.Reset(d)
	}
}

// extendLocked records a renewal of s sent at sent that Redis confirmed.
func (l *Limiter) extendLocked(s *lease, sent time.Time) {
	if v := sent.Add(l.validity); v.After(s.validUntil) {
		s.validUntil = v
		s.expiry.Reset(time.Until(v))
	}
}

// dropHeldLocked removes s from the renewal set.
func (l *Limiter) dropHeldLocked(s *lease) {
	set := l.held[s.tenant]
	delete(set, s)
	l.nheld--
	if len(set) == 0 {
		delete(l.held, s.tenant)
	}
}

// expire runs when s's local validity ends without a renewal having
// extended it: Redis may have expired it and handed its slot to another
// process, whether or not Redis answers at all. It fires on this process's
// clock alone, so a holder learns of it even while Redis hangs.
//
// The revocation is counted before Revoked closes, so that a holder reading
// Stats when it sees Revoked closed finds it, and Close waits for the log line, which
// may go to a test's output that ends with Close.
func (l *Limiter) expire(s *lease) {
	l.mu.Lock()
	if _, ok := l.held[s.tenant][s]; !ok {
		l.mu.Unlock()
		return
	}
	if d := time.Until(s.validUntil); d > 0 { // extended meanwhile
		s.expiry.Reset(d)
		l.mu.Unlock()
		return
	}
	l.c.expired.Add(1)
	l.revokeLocked(s)
	if l.closed { // Close may have returned: no log after it
		l.mu.Unlock()
		return
	}
	l.wg.Add(1) // before Close's Wait: Close sets closed under mu, then waits
	l.mu.Unlock()
	defer l.wg.Done()
	l.log.Warn("redislimit: lease not renewed in time; Redis may have given its slot away",
		"tenant", s.tenant, "mode", l.cfg.Mode.String())
}

// revokeLocked takes s, which Redis no longer vouches for, out of the
// renewal set and tells its holder: in FailClosed by closing Revoked, in
// FailOpen by turning it local. Its member is queued for release, in case
// it is still in Redis (removing a member that is gone is harmless).
func (l *Limiter) revokeLocked(s *lease) {
	l.dropHeldLocked(s)
	s.expiry.Stop()
	l.addPendingLocked(s.tenant, pendingRelease{member: s.member, until: l.releaseUntil()})
	if l.cfg.Mode == FailClosed {
		l.c.revoked.Add(1) // before Revoked closes: see expire
		close(s.done)
		return
	}
	s.local.Store(true)
	l.locals[s] = struct{}{}
	l.c.localHeld.Add(1)
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
