package pool

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ClusterLimiter keeps a tenant's cap across processes, where each process's
// Gate only sees its own share (package pool/redislimit has one backed by
// Redis). When Config.Cluster is set, a request that got one of its tenant's
// local slots asks it for a cluster-wide slot before it takes any global
// capacity, so waiting for the cluster holds no shared connection. It is
// called outside any lock, from the acquiring goroutine.
type ClusterLimiter interface {
	// AcquireSlot takes one of tenant's cluster-wide slots, of which at most
	// limit may be held at once across all processes. maxWait says how long
	// to wait when none is free: 0 not at all, a negative value until ctx
	// ends. When none is free in time it returns an error matching
	// ErrOverLimit; when ctx ends, ctx's error. When the store behind it is
	// unavailable it either returns an error (fail closed) or a lease whose
	// Local reports true (fail open, the process's own limits only).
	AcquireSlot(ctx context.Context, tenant string, limit int, maxWait time.Duration) (ClusterLease, error)
}

// ClusterLease is a cluster-wide slot. Release returns it; it may do I/O, and
// is never called under the Gate's lock.
//
// A lease that its limiter may take back while it is held (the store can no
// longer vouch for it and may have given the slot to another process) also
// has a method Revoked() <-chan struct{}, whose channel closes then; the
// holder should stop using what the slot guards. A nil channel is never
// closed. Permit.Revoked returns it.
type ClusterLease interface {
	Release()
	// Local reports that the slot is enforced by this process only, because
	// the cluster store was unavailable when it was taken (fail open).
	Local() bool
}

// revocable is the optional method of a ClusterLease that can be revoked.
type revocable interface {
	Revoked() <-chan struct{}
}

// clusterWait is how long a request of lane l may wait for a cluster slot
// when it waited for nothing before: its plan's (or class's) queue policy
// applied across processes.
func clusterWait(l *lane) time.Duration {
	maxWaiting, maxWait := l.policy()
	switch {
	case maxWaiting == 0:
		return 0
	case maxWait > 0:
		return maxWait
	default:
		return -1
	}
}

// askClusterLocked is the cluster stage of w, which holds one of its
// tenant's slots (counted in clusterPending): it asks Config.Cluster for a
// cluster slot, outside the lock, then grants w, queues it for global
// capacity, sends it back to wait for the cap if a cut took its slot
// meanwhile, or fails it. It returns ctx's error as read after the call.
func (g *Gate) askClusterLocked(ctx context.Context, w *waiter, d *TraceAcquireEndData) error {
	t, l := w.t, w.l
	// The cluster keeps the tenant's cap; adaptive limits and class caps
	// are per process (a class cap across processes would cost a second
	// round trip per request).
	limit, maxWait := t.cap, clusterWait(l)
	start := g.nowLocked()
	rejectOnly := maxWait == 0 // the plan queues nothing: a full cluster rejects
	if maxWait > 0 && w.deadline != 0 {
		// MaxWait counts from arrival: the time w waited for its local
		// slot is not waited again. Past its deadline (promoted before its
		// timer fired) it takes a free cluster slot but waits for none.
		maxWait = max(0, time.Duration(w.deadline-start))
	}
	closed := g.closed
	g.mu.Unlock()

	var lease ClusterLease
	var local bool
	ctxErr := ctx.Err()
	err := ctxErr
	if err == nil && !closed {
		lease, local, err = g.acquireSlot(ctx, w, limit, maxWait)
		ctxErr = ctx.Err()
	}

	g.mu.Lock()
	now := g.nowLocked()
	w.clusterWait += now - start
	t.clusterPending--
	l.clusterPending--
	w.lease = lease // released on leaving unless a permit takes it
	if err == nil && local && !g.closed {
		d.ClusterLocal = true
		g.clusterLocal++
	}
	switch {
	case g.closed:
		g.failLocked(w, Failed, ErrClosed)
	case ctxErr != nil && errors.Is(err, ctxErr):
		g.failLocked(w, ctxOutcome(ctxErr), ctxErr)
	case errors.Is(err, ErrOverLimit):
		o := TimedOut
		if rejectOnly {
			o = Rejected
		}
		g.failLocked(w, o, g.overLimitLocked(l, now-w.enqueued))
	case err != nil:
		g.clusterErrors++
		g.failLocked(w, Failed, fmt.Errorf("pool: cluster slot for tenant %q: %w", t.id, err))
	case l.held() >= g.laneLimitLocked(l) || t.held() >= t.cap:
		// The tenant's limit was cut while the cluster was asked: the slot
		// this request held is gone. It goes back to the front of the line
		// for the cap, keeping its cluster lease, so that it needs no second
		// round trip when a slot frees.
		w.stage, w.promoted = stageCap, 0
		l.capQ.pushFront(&w.qlink)
	case l.globalQ.n == 0 && g.grantableLocked(t, l.class):
		g.takeLocked(t, l.class)
		g.grantWaiterLocked(w, now)
	default:
		w.stage = stageGlobal
		l.globalQ.pushBack(&w.qlink)
		g.fixLinesLocked(t)
	}
	return ctxErr
}

// errNoLease is what a ClusterLimiter that answers neither a lease nor an
// error is taken to have said.
var errNoLease = errors.New("the limiter returned neither a lease nor an error")

// acquireSlot asks Config.Cluster for w's cluster slot, ending the wait when
// ctx ends or the Gate closes, and asks the lease whether it is local. It
// calls the limiter's code outside the lock only: should that code panic,
// the tenant slot and the waiting count that w holds, and the lease if there
// is one, are given back before the panic goes on to the caller.
func (g *Gate) acquireSlot(ctx context.Context, w *waiter, limit int, maxWait time.Duration) (lease ClusterLease, local bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(g.closing, cancel)
	returned := false
	defer func() {
		stop()
		cancel()
		if returned {
			return
		}
		g.mu.Lock()
		w.t.clusterPending--
		w.l.clusterPending--
		g.failLocked(w, Failed, nil)
		g.mu.Unlock()
		releaseLease(lease)
	}()
	lease, err = g.cfg.Cluster.AcquireSlot(ctx, w.t.id, limit, maxWait)
	if err == nil {
		if lease == nil {
			err = errNoLease
		} else {
			local = lease.Local()
		}
	}
	returned = true
	return lease, local, err
}
