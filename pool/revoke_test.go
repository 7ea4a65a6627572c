package pool

import (
	"context"
	"testing"
	"time"
)

// revocableCluster grants leases that carry a Revoked channel.
type revocableCluster struct{ done chan struct{} }

type revocableLease struct {
	done     chan struct{}
	released chan struct{}
}

func (l *revocableLease) Local() bool              { return false }
func (l *revocableLease) Revoked() <-chan struct{} { return l.done }
func (l *revocableLease) Release() {
	select {
	case <-l.released:
	default:
		close(l.released)
	}
}

func (c *revocableCluster) AcquireSlot(context.Context, string, int, time.Duration) (ClusterLease, error) {
	return &revocableLease{done: c.done, released: make(chan struct{})}, nil
}

// TestPermitRevokedFollowsTheLease: Revoked is the lease's Revoked while the
// permit is held, nil without a revocable lease and after Release (a
// released state is reused by the next permit).
func TestPermitRevokedFollowsTheLease(t *testing.T) {
	rc := &revocableCluster{done: make(chan struct{})}
	g, err := New(Config{Capacity: 2, Plans: map[string]Plan{"p": {MaxConns: 2}}, Cluster: rc})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	p, err := g.Acquire(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	rev := p.Revoked()
	if rev == nil {
		t.Fatal("Revoked() = nil with a revocable lease")
	}
	select {
	case <-rev:
		t.Fatal("closed before the lease was revoked")
	default:
	}
	close(rc.done)
	select {
	case <-rev:
	case <-time.After(10 * time.Second):
		t.Fatal("not closed after the lease was revoked")
	}
	p.Release()
	if p.Revoked() != nil {
		t.Error("Revoked() of a released permit is not nil")
	}

	local, err := New(Config{Capacity: 2, Plans: map[string]Plan{"p": {MaxConns: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	q, err := local.Acquire(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Release()
	if q.Revoked() != nil {
		t.Error("Revoked() without Config.Cluster is not nil")
	}
	if (Permit{}).Revoked() != nil {
		t.Error("Revoked() of the zero Permit is not nil")
	}
}
