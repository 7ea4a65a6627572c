package pool

import (
	"context"
	"fmt"
	"time"
)

// wait blocks until w is granted or failed, ctx ends, or w's MaxWait deadline
// passes while it waits for its tenant's cap. The deadline counts from when
// w arrived, whichever stage it waits in when it passes: a request sent back
// to wait for the cap by a cut times out at the deadline it came with.
func (g *Gate) wait(ctx context.Context, w *waiter, d *TraceAcquireEndData) (Permit, error) {
	var timer *time.Timer // armed once w first waits for the cap, for the rest of its MaxWait
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var timeout <-chan time.Time
	g.mu.Lock()
	for {
		if timer == nil && w.stage == stageCap && w.deadline != 0 && !w.expired {
			if left := time.Duration(w.deadline - g.nowLocked()); left > 0 {
				timer = time.NewTimer(left)
				timeout = timer.C
			} else {
				w.expired = true
			}
		}
		timedOut := w.expired && w.stage == stageCap
		g.mu.Unlock()
		if !timedOut {
			select {
			case <-w.wake:
			case <-ctx.Done():
			case <-timeout:
				timedOut = true
			}
		}
		g.mu.Lock()
		t := w.t
		var lease ClusterLease    // to release once unlocked
		if w.stage == stageDone { // granted or failed, perhaps racing ctx or the timer
			if w.err != nil {
				g.mu.Unlock()
				return Permit{}, w.err
			}
			g.fillWaitsLocked(w, d)
			if ctx.Err() == nil {
				g.mu.Unlock()
				d.Outcome = Acquired
				return w.permit, nil
			}
			// The grant raced the cancellation: give it back rather than
			// hand a permit to a caller that has gone.
			t.acquired--
			g.totals.acquired--
			w.permit.s.start = 0 // never held: its ~0 hold must not count in RetryAfter's average
			_, _, _, lease = g.releaseLocked(w.permit.s)
		} else if w.stage == stageCluster {
			// Promoted to a tenant slot: the cluster must agree before
			// global capacity is asked for. MaxWait no longer applies.
			g.mu.Unlock()
			return g.clusterStep(ctx, w, d)
		} else if ctx.Err() == nil {
			if !timedOut || w.stage == stageGlobal {
				// A leftover wake changes nothing. MaxWait bounds only the
				// wait for the tenant's own cap: a request that now holds a
				// tenant slot and waits for global capacity waits on, and
				// times out at once should a cut send it back.
				if timedOut {
					w.expired, timeout = true, nil
				} else if wakeIgnoredHook != nil {
					g.mu.Unlock()
					wakeIgnoredHook()
					g.mu.Lock()
				}
				continue
			}
			now := g.nowLocked()
			lease = g.abandonLocked(w, now)
			t.timedOut++
			g.totals.timedOut++
			err := &OverLimitError{Tenant: t.id, Limit: t.limit, RetryAfter: g.retryAfterLocked(t),
				Waited: time.Duration(now - w.enqueued)}
			g.fillWaitsLocked(w, d)
			g.mu.Unlock()
			releaseLease(lease)
			d.Outcome = TimedOut
			return Permit{}, err
		} else {
			lease = g.abandonLocked(w, g.nowLocked())
			g.fillWaitsLocked(w, d)
		}
		err := ctx.Err()
		if d.Outcome = ctxOutcome(err); d.Outcome == TimedOut {
			t.timedOut++
			g.totals.timedOut++
		} else {
			t.cancelled++
			g.totals.cancelled++
		}
		g.mu.Unlock()
		releaseLease(lease)
		return Permit{}, fmt.Errorf("pool: tenant %q: gave up waiting after %v: %w",
			t.id, (d.TenantWait + d.GlobalWait).Round(time.Microsecond), err)
	}
}

func ctxOutcome(err error) Outcome {
	if err == context.DeadlineExceeded {
		return TimedOut
	}
	return Cancelled
}

// fillWaitsLocked records w's wait in the trace data and the wait totals.
func (g *Gate) fillWaitsLocked(w *waiter, d *TraceAcquireEndData) {
	end := w.granted
	if end == 0 {
		end = g.lastNow
	}
	if w.promoted != 0 {
		d.TenantWait = time.Duration(w.promoted - w.enqueued)
		d.GlobalWait = time.Duration(end - w.promoted - w.clusterWait)
	} else {
		d.TenantWait = time.Duration(end - w.enqueued)
	}
	waited := end - w.enqueued
	w.t.waitTotal += waited
	g.totals.waitTotal += waited
}

// abandonLocked takes a waiter that gave up out of its queue. It returns the
// cluster lease the waiter held, if any, for the caller to release unlocked.
func (g *Gate) abandonLocked(w *waiter, now int64) ClusterLease {
	t, c := w.t, w.t.wait
	switch w.stage {
	case stageCap:
		c.capQ.remove(w)
	case stageGlobal:
		c.globalQ.remove(w)
		g.fixLinesLocked(t)
		g.promoteLocked(t)
		g.dispatchLocked()
	}
	w.stage = stageDone
	w.granted = now
	g.waiting--
	if t.isIdle() {
		g.markIdleLocked(t, now)
	}
	lease := w.lease
	w.lease = nil
	return lease
}

// releaseLease returns a cluster lease, if there is one.
func releaseLease(l ClusterLease) {
	if l != nil {
		l.Release()
	}
}
