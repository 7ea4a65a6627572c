package redislimit

import (
	"context"
	"time"
)

// maintain is the background goroutine that keeps held leases alive and
// removes released ones from Redis, and while degraded probes Redis. Doing
// all three in one goroutine keeps the I/O off the request path and makes
// renewals and flushes never overlap.
func (l *Limiter) maintain() {
	defer l.wg.Done()
	renew := time.NewTicker(l.cfg.RenewEvery)
	defer renew.Stop()
	probe := time.NewTicker(l.cfg.RecheckEvery)
	defer probe.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-l.kick:
			if l.healthy.Load() {
				l.flush()
			}
		case <-renew.C:
			if l.healthy.Load() {
				l.renew()
				l.flush()
			}
		case <-probe.C:
			switch {
			case !l.healthy.Load():
				if l.probe() {
					// Leases may be close to expiry after the outage.
					l.renew()
					l.flush()
				}
			case l.pendingCount() > 0:
				l.flush() // releases that failed earlier
			}
		}
	}
}

func (l *Limiter) pendingCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.npending
}

// probe asks Redis whether it answers again, and marks the limiter healthy
// if so.
func (l *Limiter) probe() bool {
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.OpTimeout)
	err := l.client.Ping(ctx).Err()
	cancel()
	l.c.roundTrips.Add(1)
	if err != nil {
		if l.ctx.Err() == nil {
			l.c.errors.Add(1)
		}
		return false
	}
	if l.healthy.CompareAndSwap(false, true) {
		l.log.Info("redislimit: redis answers again", "mode", l.cfg.Mode.String())
	}
	return true
}

// flush removes the pending releases from Redis, one script call per
// tenant in one pipeline. Those that fail go back on the queue.
func (l *Limiter) flush() {
	l.mu.Lock()
	if l.npending == 0 {
		l.mu.Unlock()
		return
	}
	batch := l.pending
	l.flushing, l.nflushing = batch, l.npending
	l.pending, l.npending = make(map[string][]pendingRelease), 0
	l.mu.Unlock()

	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.OpTimeout)
	defer cancel()
	failed := l.releaseInRedis(ctx, batch, time.Now())
	l.mu.Lock()
	l.flushing, l.nflushing = nil, 0
	for tenant, rel := range failed {
		l.addPendingLocked(tenant, rel...)
	}
	l.mu.Unlock()
}

// releaseInRedis runs releaseScript for rel in one pipeline and returns the
// releases that failed. Releases whose until is before now are dropped
// rather than sent: the lease has expired in Redis. A zero now keeps all.
func (l *Limiter) releaseInRedis(ctx context.Context, rel map[string][]pendingRelease, now time.Time) map[string][]pendingRelease {
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
		for len(live) > 0 {
			n := min(len(live), maxMembersPerCall)
			args := make([]any, 0, 1+n)
			args = append(args, k.channel)
			for _, r := range live[:n] {
				args = append(args, r.member)
			}
			calls = append(calls, &scriptCall{script: releaseScript, keys: []string{k.slots, k.waiting}, args: args})
			parts = append(parts, part{tenant, live[:n]})
			live = live[n:]
		}
	}
	if len(calls) == 0 {
		return nil
	}
	l.c.roundTrips.Add(uint64(l.runPipelined(ctx, calls)))
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
	if firstErr != nil && l.ctx.Err() == nil {
		l.noteFailure(firstErr)
	}
	return failed
}

// renew extends every lease this process holds, one script call per tenant
// in one pipeline. Leases found gone are dropped from the renewal set,
// counted and logged; their Release then does nothing.
func (l *Limiter) renew() {
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
		for len(leases) > 0 {
			n := min(len(leases), maxMembersPerCall)
			args := make([]any, 0, 2+n)
			args = append(args, l.leaseTTL, l.keyTTL)
			for _, s := range leases[:n] {
				args = append(args, s.member)
			}
			calls = append(calls, &scriptCall{script: renewScript, keys: []string{k.slots}, args: args})
			parts = append(parts, part{tenant, leases[:n]})
			leases = leases[n:]
		}
	}
	l.mu.Unlock()
	if len(calls) == 0 {
		return
	}

	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.OpTimeout)
	defer cancel()
	l.c.roundTrips.Add(uint64(l.runPipelined(ctx, calls)))
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
		if len(lost) == 0 {
			continue
		}
		l.mu.Lock()
		set := l.held[parts[i].tenant]
		n := 0
		for _, j := range lost {
			if j < 0 || int(j) >= len(leases) {
				continue
			}
			s := leases[j]
			if _, ok := set[s]; ok { // not released meanwhile
				delete(set, s)
				l.nheld--
				n++
			}
		}
		if len(set) == 0 {
			delete(l.held, parts[i].tenant)
		}
		l.mu.Unlock()
		if n > 0 {
			l.c.lost.Add(uint64(n))
			l.log.Warn("redislimit: leases lost: expired before renewal, or Redis lost its data",
				"tenant", parts[i].tenant, "lost", n)
		}
	}
	if firstErr != nil && l.ctx.Err() == nil {
		l.noteFailure(firstErr)
	}
}
