// Package fakecluster is a cluster limiter for tests that revoke leases at a
// moment of their choosing.
package fakecluster

import (
	"context"
	"sync"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

// Revoker is a pool.ClusterLimiter that grants every slot at once with a
// revocable lease; RevokeAll revokes every lease granted so far.
type Revoker struct {
	mu     sync.Mutex
	leases []*lease
}

// lease is one slot of Revoker's.
type lease struct {
	done chan struct{}
	once sync.Once
}

func (l *lease) Release()                 {}
func (l *lease) Local() bool              { return false }
func (l *lease) Revoked() <-chan struct{} { return l.done }

// AcquireSlot grants a slot at once.
func (r *Revoker) AcquireSlot(context.Context, string, int, time.Duration) (pool.ClusterLease, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := &lease{done: make(chan struct{})}
	r.leases = append(r.leases, l)
	return l, nil
}

// RevokeAll revokes every lease granted so far.
func (r *Revoker) RevokeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.leases {
		l.once.Do(func() { close(l.done) })
	}
	r.leases = nil
}
