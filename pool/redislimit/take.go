package redislimit

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// takeCall is one run of takeScript, made by its own goroutine so that the
// caller can stop waiting for it (OpTimeout, ctx) even when the client does
// not honour contexts. Whoever loses the race between the result and the
// caller's giving up cleans up: see runTake.
type takeCall struct {
	state atomic.Int32 // callRunning, then one of the others
	done  chan struct{}
	res   takeResult // set before state leaves callRunning
	err   error
}

const (
	callRunning int32 = iota
	callDone
	callAbandoned        // the caller's ctx ended
	callAbandonedTimeout // OpTimeout passed; the caller counted the failure
)

// take runs takeScript once for tenant, carrying this process's pending
// releases of the tenant. On success it registers the lease for renewal.
func (l *Limiter) take(ctx context.Context, tenant string, k keys, limit int, mode string) (takeResult, *lease, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return takeResult{}, nil, ErrClosed
	}
	carry := l.claimPendingLocked(tenant)
	inFlight := l.flushing[tenant]
	inFlight = inFlight[:min(len(inFlight), maxMembersPerCall-len(carry))]
	l.wg.Add(1)
	l.mu.Unlock()

	member := l.newMember()
	args := make([]any, 0, 7+len(carry)+len(inFlight))
	args = append(args, member, limit, l.leaseTTL, l.keyTTL, mode, l.markTTL, k.channel)
	for _, r := range carry {
		args = append(args, r.member)
	}
	for _, r := range inFlight {
		args = append(args, r.member)
	}
	call := &takeCall{done: make(chan struct{})}
	sent := time.Now()
	go l.runTake(call, tenant, k, member, carry, args)

	timer := time.NewTimer(l.cfg.OpTimeout)
	defer timer.Stop()
	select {
	case <-call.done:
	case <-timer.C:
		if call.state.CompareAndSwap(callRunning, callAbandonedTimeout) {
			err := fmt.Errorf("take: %w (%v)", errTimedOut, l.cfg.OpTimeout)
			l.noteFailure(err)
			return takeResult{}, nil, err
		}
	case <-ctx.Done():
		if call.state.CompareAndSwap(callRunning, callAbandoned) {
			return takeResult{}, nil, ctx.Err()
		}
	}
	<-call.done // lost the race: the result is there
	if call.err != nil || !call.res.took {
		return call.res, nil, call.err
	}
	s := l.newLease(tenant, member)
	l.mu.Lock()
	if l.closed {
		// Close is waiting for this call; its final flush releases it.
		l.addPendingLocked(tenant, pendingRelease{member: member, until: l.releaseUntil()})
		l.mu.Unlock()
		return takeResult{}, nil, ErrClosed
	}
	l.holdLocked(s, sent)
	l.mu.Unlock()
	l.c.acquired.Add(1)
	return call.res, s, nil
}

// runTake makes a take call's Redis round trip. When the outcome is unknown
// (the call failed: it may have run anyway), it queues the member and the
// carried releases for release, which is harmless for members that are not
// there; when the caller gave up on a take that succeeded, it releases the
// member. So no slot outlives a failed or abandoned take by more than the
// time Redis takes to answer a flush.
func (l *Limiter) runTake(call *takeCall, tenant string, k keys, member string, carry []pendingRelease, args []any) {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.OpTimeout)
	start := time.Now()
	cmd, rt := l.run(ctx, takeScript, true, []string{k.slots, k.waiting}, args...)
	cancel()
	l.c.roundTrips.Add(uint64(rt))
	res, err := parseTake(cmd)
	res.rtt = time.Since(start)
	call.res, call.err = res, err
	if call.state.CompareAndSwap(callRunning, callDone) {
		// Counted before the caller hears of it, so that Stats read after a
		// failed AcquireSlot show the failure.
		if err != nil && l.ctx.Err() == nil {
			l.noteFailure(err)
		}
		close(call.done)
	} else if err != nil && l.ctx.Err() == nil && call.state.Load() != callAbandonedTimeout {
		l.noteFailure(err)
	}
	var undo []pendingRelease
	switch {
	case err != nil:
		undo = append(append(make([]pendingRelease, 0, len(carry)+1), carry...),
			pendingRelease{member: member, until: l.releaseUntil()})
	case res.took && call.state.Load() != callDone:
		undo = []pendingRelease{{member: member, until: l.releaseUntil()}}
	default:
		l.c.released.Add(uint64(len(carry)))
		return
	}
	l.mu.Lock()
	l.addPendingLocked(tenant, undo...)
	closed := l.closed
	l.mu.Unlock()
	if !closed {
		l.kickMaintenance()
	}
}
