package pool

// waiter is one request that could not be served on arrival. Its wake channel
// is signalled, under Gate.mu, when its stage changes in a way it must act
// on: granted or failed (stageDone), promoted to a tenant slot that the
// cluster must confirm (stageCluster), or sent back to wait for the cap
// (stageCap, after a cut).
type waiter struct {
	t           *tenant
	l           *lane         // its tenant's lane of its class
	qlink       link[waiter]  // guarded by Gate.mu: in its lane's capQ or globalQ
	wake        chan struct{} // buffered, 1
	stage       waitStage     // guarded by Gate.mu
	permit      Permit        // guarded by Gate.mu: set when granted
	outcome     Outcome       // guarded by Gate.mu: set when failed
	err         error         // guarded by Gate.mu: set when failed
	enqueued    int64         // clock when it began to wait
	deadline    int64         // enqueued + the plan's (or class's) MaxWait, 0 without one or for a Runner's request
	expired     bool          // guarded by Gate.mu: deadline passed while it waited for global capacity
	promoted    int64         // guarded by Gate.mu: clock when it got a tenant slot
	done        int64         // guarded by Gate.mu: clock when it was granted or failed
	lease       ClusterLease  // guarded by Gate.mu: its cluster slot, once it has one
	clusterWait int64         // guarded by Gate.mu: time spent taking the cluster slot
}

type waitStage uint8

const (
	stageCap     waitStage = iota // over its lane's or tenant's limit, in capQ
	stageCluster                  // holding a tenant slot, asking Config.Cluster for a cluster slot
	stageGlobal                   // holding a tenant slot, in globalQ
	stageDone                     // granted or failed; in no queue
)

// public is the Stage that names s in a *WaitError.
func (s waitStage) public() Stage {
	switch s {
	case stageCluster:
		return StageCluster
	case stageGlobal:
		return StageShared
	default:
		return StageTenant
	}
}

func newWaiter(l *lane, now int64) *waiter {
	w := &waiter{t: l.t, l: l, wake: make(chan struct{}, 1), enqueued: now}
	w.qlink.v = w
	if _, mw := l.policy(); mw > 0 {
		w.deadline = now + int64(mw)
	}
	return w
}

// signal wakes the waiter's goroutine; a wake already pending is enough.
func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// endLocked records that w leaves its stages: granted when err is nil.
func (w *waiter) endLocked(o Outcome, err error, now int64) {
	w.stage, w.outcome, w.err, w.done = stageDone, o, err, now
	w.signal()
}
