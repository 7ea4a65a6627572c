package redislimit

import (
	"context"
	"fmt"
	"time"
)

// maintain is the background goroutine that keeps held leases alive and
// removes released ones from Redis, and while degraded tries to reconcile.
// Doing all three in one goroutine keeps the I/O off the request path and
// makes renewals and flushes never overlap. Each call is bounded by
// OpTimeout on this side (see background), whatever the client's own timeouts.
//
// A due renewal goes before any other call: Go's select picks at random
// among ready cases, and under a steady stream of releases flush after
// flush could run first. So a renewal waits for one call at most, the one
// running when it fell due: it is sent within OpTimeout of being due.
func (l *Limiter) maintain() {
	defer l.wg.Done()
	renew := time.NewTicker(l.cfg.RenewEvery)
	defer renew.Stop()
	recheck := time.NewTimer(l.cfg.RecheckEvery)
	defer recheck.Stop()
	next := time.Now().Add(l.cfg.RecheckEvery) // when recheck fires
	checkedEviction := false
	wasHealthy := true
	// The calls that follow a renewal, one an iteration, each after the
	// check for a due renewal: the assertion of local grants, and the flush
	// of what the renewal found released.
	afterRenewal := []func(context.Context) error{l.assertLocals, l.flush}
	var after []func(context.Context) error
	renewal := func() {
		after = nil
		if !l.healthy.Load() || l.background(l.renew) != nil {
			return
		}
		after = afterRenewal
		if !checkedEviction {
			checkedEviction = true
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.warnEviction()
			}()
		}
	}
	for {
		fired := false
		select {
		case <-l.done:
			return
		case <-renew.C:
			renewal()
		default:
			if len(after) > 0 {
				step := after[0]
				after = after[1:]
				if !l.healthy.Load() || l.background(step) != nil {
					after = nil
				}
				break
			}
			select {
			case <-l.done:
				return
			case <-l.kick:
				if l.healthy.Load() {
					l.background(l.flush)
				}
			case <-renew.C:
				renewal()
			case <-recheck.C:
				fired = true
				switch {
				case !l.healthy.Load():
					l.reconcile()
				case l.pendingCount() > 0:
					l.background(l.flush) // releases that failed earlier
				}
			}
		}
		// Healthy, recheck fires every RecheckEvery. Degraded, no later
		// than retryDelay after the last attempt or the failure.
		healthy := l.healthy.Load()
		if fired || (wasHealthy && !healthy) {
			now := time.Now()
			d := l.cfg.RecheckEvery
			if !healthy {
				d = l.retryDelay(now)
			}
			if fired || now.Add(d).Before(next) {
				next = now.Add(d)
				recheck.Reset(d)
			}
		}
		wasHealthy = healthy
	}
}

// retryDelay is how long after now a degraded limiter tries to reconcile
// again: RecheckEvery, but no more than a quarter of the time left before
// the soonest held lease's validity ends, so that when Redis answers again
// the leases are renewed before they lapse, not revoked at the next
// RecheckEvery. The attempts thus come more often as the validity runs out,
// a few dozen at most before it ends (each lasts up to OpTimeout); after it
// ends no lease is held and they come every RecheckEvery again.
func (l *Limiter) retryDelay(now time.Time) time.Duration {
	d := l.cfg.RecheckEvery
	l.mu.Lock()
	for _, set := range l.held {
		for s := range set {
			d = min(d, s.validUntil.Sub(now)/4)
		}
	}
	l.mu.Unlock()
	return max(d, time.Millisecond)
}

// reconcile brings a degraded limiter back: it probes Redis with a write,
// then, before any request may take a slot again, renews the leases still
// held (those Redis lost are revoked), asserts the local grants made during
// the outage that are still held, and flushes the releases, and only then
// marks the limiter healthy. Marking it healthy first would let a take purge
// the held leases that expired in Redis during the outage, and hand their
// slots to new requests while the old ones still run.
func (l *Limiter) reconcile() {
	for _, step := range []func(context.Context) error{l.probe, l.renew, l.assertLocals, l.flush} {
		if l.background(step) != nil {
			return
		}
	}
	if l.healthy.CompareAndSwap(false, true) {
		l.c.reconciles.Add(1)
		l.log.Info("redislimit: redis answers again; held leases renewed, local grants asserted", "mode", l.cfg.Mode.String())
	}
}

// background runs f, one Redis round trip or pipeline, in a goroutine of its
// own under a context bounded by OpTimeout, and waits for it at most
// OpTimeout: a client without ContextTimeoutEnabled waits on the socket for
// its ReadTimeout (3s by default) whatever the context says, and a renewal
// that waits that long lets leases expire. A call that outlives OpTimeout
// counts as a failure; it finishes on its own, and the next one is not
// started before it does (calls never overlap). A failure marks the limiter
// degraded; the error is returned.
func (l *Limiter) background(f func(ctx context.Context) error) error {
	// After Close, maintain's select may still pick another case while the
	// call Close interrupted runs on: that is no failure of Redis.
	select {
	case <-l.done:
		return ErrClosed
	default:
	}
	if !l.bgBusy.CompareAndSwap(false, true) {
		err := fmt.Errorf("the previous call is still running: %w", errTimedOut)
		l.noteFailure(err)
		return err
	}
	done := make(chan error, 1)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		ctx, cancel := context.WithTimeout(l.ctx, l.cfg.OpTimeout)
		err := f(ctx)
		cancel()
		l.bgBusy.Store(false)
		done <- err
	}()
	t := time.NewTimer(l.cfg.OpTimeout)
	defer t.Stop()
	var err error
	select {
	case err = <-done:
	case <-t.C:
		err = errTimedOut
	case <-l.done:
		return ErrClosed
	}
	if err != nil && l.ctx.Err() == nil {
		l.noteFailure(err)
	}
	return err
}

func (l *Limiter) pendingCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.npending
}

// probe asks Redis whether it takes writes and runs scripts again.
func (l *Limiter) probe(ctx context.Context) error {
	cmd, rt := l.run(ctx, probeScript, true, []string{"{" + l.cfg.Prefix + "}:probe"})
	l.c.roundTrips.Add(uint64(rt))
	return cmd.Err()
}

// flush removes the pending releases from Redis, one script call per
// tenant in one pipeline. Those that fail go back on the queue.
func (l *Limiter) flush(ctx context.Context) error {
	l.mu.Lock()
	if l.npending == 0 {
		l.mu.Unlock()
		return nil
	}
	batch := l.pending
	l.flushing, l.nflushing = batch, l.npending
	l.pending, l.npending = make(map[string][]pendingRelease), 0
	l.mu.Unlock()

	failed, err := l.releaseInRedis(ctx, batch, time.Now())
	l.mu.Lock()
	l.flushing, l.nflushing = nil, 0
	for tenant, rel := range failed {
		l.addPendingLocked(tenant, rel...)
	}
	l.mu.Unlock()
	return err
}

// releaseInRedis runs releaseScript for rel in one pipeline and returns the
// releases that failed, and the first error. Releases whose until is before now are dropped
// rather than sent: the lease has expired in Redis. A zero now keeps all.
func (l *Limiter) releaseInRedis(ctx context.Context, rel map[string][]pendingRelease, now time.Time) (map[string][]pendingRelease, error) {
	type part struct {
		tenant string
		rel    []pendingRelease
	}
	var (
		calls []*scriptCall
		parts []part
	)
	for tenant, rs := range rel {
		var live []pendingRelease // rs may be shared with takes (flushing): not filtered in place
		for _, r := range rs {
			if now.IsZero() || now.Before(r.until) {
				live = append(live, r)
			} else {
				l.c.releasesExpired.Add(1)
			}
		}
		k := tenantKeys(l.cfg.Prefix, tenant)
		calls = memberCalls(calls, releaseScript, []string{k.slots, k.waiting}, []any{k.channel}, live,
			func(r pendingRelease) string { return r.member },
			func(chunk []pendingRelease) { parts = append(parts, part{tenant, chunk}) })
	}
	if len(calls) == 0 {
		return nil, nil
	}
	l.c.roundTrips.Add(uint64(l.runPipelined(ctx, calls, false)))
	var failed map[string][]pendingRelease
	var firstErr error
	for i, c := range calls {
		if err := c.cmd.Err(); err != nil {
			if failed == nil {
				failed = make(map[string][]pendingRelease)
			}
			failed[parts[i].tenant] = append(failed[parts[i].tenant], parts[i].rel...)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		l.c.released.Add(uint64(len(parts[i].rel)))
	}
	return failed, firstErr
}

// renew extends every lease this process holds, one script call per tenant
// in one pipeline, and extends their local validity from the time the
// pipeline was sent. Leases found gone are revoked (see revokeLocked);
// their Release then does nothing.
func (l *Limiter) renew(ctx context.Context) error {
	type part struct {
		tenant string
		leases []*lease
	}
	var (
		calls []*scriptCall
		parts []part
	)
	// O(leases held) under the lock, once per RenewEvery: a process holds
	// at most one lease per permit of its Gates, so at most their capacity.
	l.mu.Lock()
	for tenant, set := range l.held {
		k := tenantKeys(l.cfg.Prefix, tenant)
		leases := make([]*lease, 0, len(set))
		for s := range set {
			leases = append(leases, s)
		}
		calls = memberCalls(calls, renewScript, []string{k.slots}, []any{l.leaseTTL, l.keyTTL}, leases,
			func(s *lease) string { return s.member },
			func(chunk []*lease) { parts = append(parts, part{tenant, chunk}) })
	}
	l.mu.Unlock()
	if len(calls) == 0 {
		return nil
	}

	sent := time.Now()
	l.c.roundTrips.Add(uint64(l.runPipelined(ctx, calls, true)))
	var firstErr error
	for i, c := range calls {
		lost, err := c.cmd.Int64Slice()
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		leases := parts[i].leases
		l.c.renewals.Add(uint64(len(leases) - len(lost)))
		isLost := make(map[int64]bool, len(lost))
		for _, j := range lost {
			isLost[j] = true
		}
		n := 0
		l.mu.Lock()
		set := l.held[parts[i].tenant]
		for j, s := range leases {
			_, held := set[s]
			switch {
			case !held:
				// Released or revoked meanwhile; this renewal may have
				// extended it in Redis after its release was flushed.
				if !isLost[int64(j)] {
					l.addPendingLocked(s.tenant, pendingRelease{member: s.member, until: l.releaseUntil()})
				}
			case isLost[int64(j)]:
				l.c.lost.Add(1) // before Revoked closes: see expire
				l.revokeLocked(s)
				n++
			default:
				l.extendLocked(s, sent)
			}
		}
		l.mu.Unlock()
		if n > 0 {
			l.log.Warn("redislimit: leases lost: expired before renewal, or Redis lost its data",
				"tenant", parts[i].tenant, "lost", n, "mode", l.cfg.Mode.String())
		}
	}
	return firstErr
}

// assertLocals adds to Redis, under new members, the local grants (FailOpen)
// still held, whatever the limit (see assertScript), and from then on renews
// and releases them as leases taken in Redis.
func (l *Limiter) assertLocals(ctx context.Context) error {
	type grant struct {
		s      *lease
		member string
	}
	l.mu.Lock()
	if len(l.locals) == 0 {
		l.mu.Unlock()
		return nil
	}
	byTenant := make(map[string][]grant)
	for s := range l.locals {
		byTenant[s.tenant] = append(byTenant[s.tenant], grant{s, l.newMember()})
	}
	l.mu.Unlock()

	var (
		calls []*scriptCall
		parts [][]grant
	)
	for tenant, gs := range byTenant {
		k := tenantKeys(l.cfg.Prefix, tenant)
		calls = memberCalls(calls, assertScript, []string{k.slots}, []any{l.leaseTTL, l.keyTTL}, gs,
			func(g grant) string { return g.member },
			func(chunk []grant) { parts = append(parts, chunk) })
	}
	sent := time.Now()
	l.c.roundTrips.Add(uint64(l.runPipelined(ctx, calls, true)))
	var firstErr error
	for i, c := range calls {
		err := c.cmd.Err()
		l.mu.Lock()
		for _, g := range parts[i] {
			s := g.s
			if _, ok := l.locals[s]; !ok || err != nil {
				// Released meanwhile, or the outcome is unknown: the new
				// member may be in Redis; remove it.
				l.addPendingLocked(s.tenant, pendingRelease{member: g.member, until: l.releaseUntil()})
				continue
			}
			delete(l.locals, s)
			l.c.localHeld.Add(-1)
			s.member = g.member
			s.local.Store(false)
			l.holdLocked(s, sent)
		}
		l.mu.Unlock()
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}
