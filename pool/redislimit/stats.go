package redislimit

import "sync/atomic"

// Stats is a snapshot of a Limiter's state and counters since New.
type Stats struct {
	// Mode is the configured failure mode.
	Mode Mode
	// Healthy is false while the limiter is degraded: a Redis call failed
	// and no probe has succeeded since, so requests follow Mode without
	// asking Redis.
	Healthy bool
	// Degradations counts the times it went from healthy to degraded.
	Degradations uint64

	// Held is the leases this process holds in Redis (and renews);
	// LocalHeld, the leases granted by FailOpen that are not yet released.
	Held, LocalHeld int
	// PendingReleases is the released leases not yet removed from Redis:
	// normally a handful in flight, more while Redis is unavailable.
	PendingReleases int

	// Acquired counts slots taken in Redis; Rejected, requests refused
	// because all of their tenant's cluster slots were held and they could
	// not wait or waited in vain; Waited, requests that had to wait;
	// Wakeups, notifications that woke a waiting request.
	Acquired, Rejected, Waited, Wakeups uint64
	// FailOpenGrants counts local leases granted because Redis could not
	// be asked; FailClosedErrors, requests refused for the same reason.
	FailOpenGrants, FailClosedErrors uint64

	// RoundTrips counts calls to Redis: one per command or pipeline,
	// two when a script had to be sent again (EVALSHA met NOSCRIPT).
	RoundTrips uint64
	// Errors counts Redis calls that failed or timed out.
	Errors uint64
	// ErrorsByKind splits Errors: see ErrorKind.
	ErrorsByKind [numErrorKinds]uint64
	// Renewals counts leases renewed; LostLeases, held leases a renewal
	// found gone (expired and taken, or Redis lost its data).
	Renewals, LostLeases uint64
	// ExpiredLeases counts held leases whose local validity ran out before
	// a renewal confirmed them (the process was cut off from Redis, paused,
	// or Redis hung). RevokedLeases counts the leases revoked (Revoked closed,
	// FailClosed) for either reason; in FailOpen they turn local instead.
	ExpiredLeases, RevokedLeases uint64
	// Reconciles counts recoveries: held leases renewed and local grants
	// asserted in Redis before the limiter was marked healthy again.
	Reconciles uint64
	// Released counts releases carried out in Redis (a lease found already
	// expired there counts too);
	// ReleasesExpired, releases given up after repeated failures because
	// the lease had expired in Redis by then anyway.
	Released, ReleasesExpired uint64
}

// counters are the Stats counters, updated without the Limiter's lock.
type counters struct {
	degradations, acquired, rejected, waited, wakeups atomic.Uint64
	failOpen, failClosed, roundTrips, errors          atomic.Uint64
	renewals, lost, released, releasesExpired         atomic.Uint64
	expired, revoked, reconciles                      atomic.Uint64
	byKind                                            [numErrorKinds]atomic.Uint64
	localHeld                                         atomic.Int64
}

// Stats returns a snapshot of the limiter's state and counters.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	held, pending := l.nheld, l.npending+l.nflushing
	l.mu.Unlock()
	c := &l.c
	var byKind [numErrorKinds]uint64
	for i := range byKind {
		byKind[i] = c.byKind[i].Load()
	}
	return Stats{
		ErrorsByKind:     byKind,
		Mode:             l.cfg.Mode,
		Healthy:          l.healthy.Load(),
		Degradations:     c.degradations.Load(),
		Held:             held,
		LocalHeld:        int(c.localHeld.Load()),
		PendingReleases:  pending,
		Acquired:         c.acquired.Load(),
		Rejected:         c.rejected.Load(),
		Waited:           c.waited.Load(),
		Wakeups:          c.wakeups.Load(),
		FailOpenGrants:   c.failOpen.Load(),
		FailClosedErrors: c.failClosed.Load(),
		RoundTrips:       c.roundTrips.Load(),
		Errors:           c.errors.Load(),
		Renewals:         c.renewals.Load(),
		LostLeases:       c.lost.Load(),
		ExpiredLeases:    c.expired.Load(),
		RevokedLeases:    c.revoked.Load(),
		Reconciles:       c.reconciles.Load(),
		Released:         c.released.Load(),
		ReleasesExpired:  c.releasesExpired.Load(),
	}
}
