package pool

// waiter is one request waiting for a permit. Its wake channel is signalled,
// under Gate.mu, when its stage changes in a way it must act on: granted or
// failed (stageDone), or promoted to a tenant slot that the cluster must
// confirm (stageCluster).
type waiter struct {
	t           *tenant
	prev, next  *waiter       // guarded by Gate.mu
	wake        chan struct{} // buffered, 1
	stage       waitStage     // guarded by Gate.mu
	permit      Permit        // guarded by Gate.mu: set when granted
	err         error         // guarded by Gate.mu: set when failed
	enqueued    int64         // clock when it began to wait
	deadline    int64         // enqueued + the plan's MaxWait, 0 without one
	expired     bool          // guarded by Gate.mu: deadline passed while it waited for global capacity
	promoted    int64         // guarded by Gate.mu: clock when it got a tenant slot
	granted     int64         // guarded by Gate.mu: clock when it got the permit
	lease       ClusterLease  // guarded by Gate.mu: its cluster slot, once it has one
	clusterWait int64         // guarded by Gate.mu: time spent taking the cluster slot
}

type waitStage uint8

const (
	stageCap     waitStage = iota // over the tenant's cap, in capQ
	stageCluster                  // holding a tenant slot, asking Config.Cluster for a cluster slot
	stageGlobal                   // holding a tenant slot, in globalQ
	stageDone                     // granted or failed; in no queue
)

// signal wakes the waiter's goroutine; a wake already pending is enough.
func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// waitQueue is a FIFO of waiters with O(1) removal from the middle, which a
// cancelled wait needs.
type waitQueue struct {
	head, tail *waiter
	n          int
}

func (q *waitQueue) pushBack(w *waiter) {
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n++
}

func (q *waitQueue) pushFront(w *waiter) {
	w.prev, w.next = nil, q.head
	if q.head != nil {
		q.head.prev = w
	} else {
		q.tail = w
	}
	q.head = w
	q.n++
}

func (q *waitQueue) popFront() *waiter {
	w := q.head
	if w != nil {
		q.remove(w)
	}
	return w
}

func (q *waitQueue) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
	q.n--
}
