package redislimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

// Take modes (see takeScript).
const (
	modeTry    = "0" // may not wait
	modeFresh  = "1" // first attempt of a request that may wait
	modeWaiter = "2" // a request that waited
)

// errDegraded is the cause given while degraded.
var errDegraded = errors.New("a recent call failed and no probe has succeeded since")

// AcquireSlot takes one of tenant's cluster-wide slots, of which at most
// limit may be held at once by all processes sharing the Redis and Prefix
// (each process passes its own limit; they should agree). maxWait says how
// long to wait when none is free: 0 not at all, a negative value until ctx
// ends. It returns:
//   - an error matching pool.ErrOverLimit when no slot was free in time;
//   - ctx's error when ctx ended first;
//   - ErrClosed after Close;
//   - when Redis could not be asked within OpTimeout, or the limiter is
//     degraded: a lease whose Local reports true (FailOpen), or an error
//     matching ErrUnavailable (FailClosed).
//
// ctx governs the whole call: the Redis calls (each also bounded by
// OpTimeout) and the wait.
func (l *Limiter) AcquireSlot(ctx context.Context, tenant string, limit int, maxWait time.Duration) (pool.ClusterLease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	l.wg.Add(1)
	l.mu.Unlock()
	defer l.wg.Done()

	if !l.healthy.Load() {
		return l.unavailable(tenant, errDegraded)
	}
	k := tenantKeys(l.cfg.Prefix, tenant)
	var deadline <-chan time.Time
	if maxWait > 0 {
		t := time.NewTimer(maxWait)
		defer t.Stop()
		deadline = t.C
	}
	mode := modeTry
	if maxWait != 0 {
		mode = modeFresh
	}
	var (
		w       *watcher
		recheck *time.Timer
		waited  bool
	)
	defer func() {
		if w != nil {
			l.n.unwatch(w)
		}
		if recheck != nil {
			recheck.Stop()
		}
	}()
	for {
		r, s, err := l.take(ctx, tenant, k, limit, mode)
		switch {
		case err == nil && r.took:
			return s, nil
		case err == nil:
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, ErrClosed):
			return nil, err
		default:
			return l.unavailable(tenant, err)
		}
		if maxWait == 0 {
			l.c.rejected.Add(1)
			return nil, overLimit(tenant, r.held, limit, false)
		}
		if !waited {
			waited = true
			l.c.waited.Add(1)
		}
		mode = modeWaiter
		if r.held < limit {
			// A new request that queued behind marked waiters although a
			// slot is free. Give them a moment (two round trips: their
			// notification, their take) to claim it, then try again as a
			// waiter, which takes it if they did not: the mark may outlive
			// the waiters, and no notification would come.
			if err := l.pause(ctx, max(time.Millisecond, 2*r.rtt), deadline); err != nil {
				return l.waitEnded(tenant, r.held, limit, err)
			}
			continue
		}
		if w == nil {
			w = l.n.watch(k.channel)
		}
		// Sleep until a notification, or until the soonest lease would
		// expire (a process that died announces nothing), or for a
		// re-check, whichever comes first.
		sleep := l.recheckDelay(r.soonest)
		if recheck == nil {
			recheck = time.NewTimer(sleep)
		} else {
			recheck.Reset(sleep)
		}
		// A notification is only certain to arrive once the subscription is
		// confirmed; until then wait for the confirmation and try again.
		ready := l.n.readyChan(w)
		wake := ready
		if wake == nil {
			wake = w.wake
			if l.sleepHook != nil {
				l.sleepHook(tenant)
			}
		}
		select {
		case <-wake:
			if ready == nil {
				l.n.ack(w)
			}
		case <-recheck.C:
		case <-ctx.Done():
			return l.waitEnded(tenant, r.held, limit, ctx.Err())
		case <-deadline:
			return l.waitEnded(tenant, r.held, limit, errDeadline)
		case <-l.done:
			return l.waitEnded(tenant, r.held, limit, ErrClosed)
		}
		if !l.healthy.Load() {
			return l.unavailable(tenant, errDegraded)
		}
	}
}

// errDeadline reports that maxWait ran out.
var errDeadline = errors.New("maxWait ran out")

// pause sleeps for d unless ctx ends, maxWait runs out or the limiter
// closes, which it reports as ctx's error, errDeadline or ErrClosed.
func (l *Limiter) pause(ctx context.Context, d time.Duration, deadline <-chan time.Time) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-deadline:
		return errDeadline
	case <-l.done:
		return ErrClosed
	}
}

// waitEnded is AcquireSlot's answer when its wait ends without a slot.
func (l *Limiter) waitEnded(tenant string, held, limit int, why error) (pool.ClusterLease, error) {
	if why == errDeadline {
		l.c.rejected.Add(1)
		return nil, overLimit(tenant, held, limit, true)
	}
	return nil, why
}

// recheckDelay is how long a waiter sleeps without a notification: up to
// RecheckEvery, with jitter so that waiters of many processes do not ask in
// step, but no longer than until the soonest lease expires.
func (l *Limiter) recheckDelay(soonestMs int64) time.Duration {
	d := l.cfg.RecheckEvery
	d -= time.Duration(rand.Int64N(int64(d)/4 + 1))
	if soonestMs >= 0 {
		d = min(d, time.Duration(soonestMs+1)*time.Millisecond)
	}
	return d
}

// unavailable answers a request that Redis could not decide, as Mode says;
// after Close, with ErrClosed: Close cancels the calls in flight, and their
// failure says nothing about Redis.
func (l *Limiter) unavailable(tenant string, cause error) (pool.ClusterLease, error) {
	if l.ctx.Err() != nil {
		return nil, ErrClosed
	}
	if l.cfg.Mode == FailOpen {
		s := &lease{l: l, tenant: tenant}
		s.local.Store(true)
		l.mu.Lock()
		l.locals[s] = struct{}{}
		l.mu.Unlock()
		l.c.failOpen.Add(1)
		l.c.localHeld.Add(1)
		return s, nil
	}
	l.c.failClosed.Add(1)
	return nil, fmt.Errorf("redislimit: tenant %q: %w: %w", tenant, ErrUnavailable, cause)
}
