package pool

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// memCluster is an in-process ClusterLimiter: the gate's side of the
// protocol is tested against it here; pool/redislimit is tested against a
// real Redis.
type memCluster struct {
	mu       sync.Mutex
	held     map[string]int // guarded by mu
	max      map[string]int // guarded by mu: most ever held at once
	changed  chan struct{}  // guarded by mu: closed and replaced on every release
	failWith error          // guarded by mu
	local    bool           // guarded by mu
	leases   int            // guarded by mu: outstanding
	delay    time.Duration  // each AcquireSlot first sleeps up to this long, as a round trip would; set before use
}

func newMemCluster() *memCluster {
	return &memCluster{held: map[string]int{}, max: map[string]int{}, changed: make(chan struct{})}
}

type memLease struct {
	c      *memCluster
	tenant string
	once   sync.Once
	local  bool
}

func (l *memLease) Local() bool { return l.local }

func (l *memLease) Release() {
	l.once.Do(func() {
		l.c.mu.Lock()
		defer l.c.mu.Unlock()
		l.c.leases--
		if !l.local {
			l.c.held[l.tenant]--
			close(l.c.changed)
			l.c.changed = make(chan struct{})
		}
	})
}

func (c *memCluster) AcquireSlot(ctx context.Context, tenant string, limit int, maxWait time.Duration) (ClusterLease, error) {
	if c.delay > 0 {
		time.Sleep(rand.N(c.delay)) // the round trip, not synchronisation
	}
	var timeout <-chan time.Time
	if maxWait > 0 {
		timer := time.NewTimer(maxWait)
		defer timer.Stop()
		timeout = timer.C
	}
	for {
		c.mu.Lock()
		if c.failWith != nil {
			c.mu.Unlock()
			return nil, c.failWith
		}
		if c.local {
			c.leases++
			c.mu.Unlock()
			return &memLease{c: c, tenant: tenant, local: true}, nil
		}
		if c.held[tenant] < limit {
			c.held[tenant]++
			c.max[tenant] = max(c.max[tenant], c.held[tenant])
			c.leases++
			c.mu.Unlock()
			return &memLease{c: c, tenant: tenant}, nil
		}
		changed := c.changed
		c.mu.Unlock()
		if maxWait == 0 {
			return nil, ErrOverLimit
		}
		select {
		case <-changed:
		case <-timeout:
			return nil, ErrOverLimit
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (c *memCluster) outstanding() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leases
}

func TestClusterCapacityNotHeldWhileAsking(t *testing.T) {
	// While slow's request waits for the cluster, the whole global capacity
	// stays available to other tenants.
	mc := newMemCluster()
	g, _ := newTestGate(t, Config{Capacity: 2, Cluster: mc, Plans: map[string]Plan{"p": {MaxConns: 2, MaxWaiting: 1}}})
	// Hold slow's cluster-wide slots from "another process".
	mc.held["slow"] = 2
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := g.Acquire(ctx, "slow"); done <- err }()
	waitUntil(t, "slow waits for a cluster slot", func() bool { s, _ := g.TenantStat("slow"); return s.Waiting == 1 })
	a, b := acquire(t, g, "other"), acquire(t, g, "other")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	a.Release()
	b.Release()
	if s := g.Stat(); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("Stat = %+v", s)
	}
}

func TestClusterOutcomes(t *testing.T) {
	mc := newMemCluster()
	rec := &outcomeTracer{}
	g, _ := newTestGate(t, Config{Capacity: 4, Cluster: mc, Tracer: rec,
		Plans: map[string]Plan{"p": {MaxConns: 2}, "q": {MaxConns: 2, MaxWaiting: 2, MaxWait: 5 * time.Millisecond}}, DefaultPlan: "p",
		Lookup: func(_ context.Context, id string) (Tenant, error) {
			if id == "queued" {
				return Tenant{Plan: "q"}, nil
			}
			return Tenant{}, nil
		}})

	mc.held["busy"] = 2 // its cluster slots are taken elsewhere
	_, err := g.Acquire(context.Background(), "busy")
	var ole *OverLimitError
	if !errors.As(err, &ole) || ole.Limit != 2 || ole.Waited != 0 || rec.last.Outcome != Rejected {
		t.Fatalf("reject plan: err = %v, outcome %v", err, rec.last.Outcome)
	}
	mc.held["queued"] = 2
	_, err = g.Acquire(context.Background(), "queued")
	if !errors.As(err, &ole) || rec.last.Outcome != TimedOut { // (the gate's clock is fake here)
		t.Fatalf("queue plan: err = %v, outcome %v", err, rec.last.Outcome)
	}

	mc.mu.Lock()
	mc.failWith = errors.New("redis: connection refused")
	mc.mu.Unlock()
	_, err = g.Acquire(context.Background(), "acme")
	if err == nil || rec.last.Outcome != Failed || g.Stat().ClusterErrors != 1 {
		t.Fatalf("fail closed: err = %v, outcome %v", err, rec.last.Outcome)
	}

	mc.mu.Lock()
	mc.failWith, mc.local = nil, true
	mc.mu.Unlock()
	p := acquire(t, g, "acme")
	if !rec.last.ClusterLocal || g.Stat().ClusterLocal != 1 {
		t.Fatalf("fail open not visible: %+v %+v", rec.last, g.Stat())
	}
	p.Release()
	if s := g.Stat(); s.InUse != 0 || s.Waiting != 0 || mc.outstanding() != 0 {
		t.Fatalf("held after the outcomes: %+v, %d leases", s, mc.outstanding())
	}
}

type outcomeTracer struct{ last TraceAcquireEndData }

func (o *outcomeTracer) TraceAcquireStart(ctx context.Context, _ *Gate, _ TraceAcquireStartData) context.Context {
	return ctx
}
func (o *outcomeTracer) TraceAcquireEnd(_ context.Context, _ *Gate, d TraceAcquireEndData) {
	o.last = d
}

func TestClusterLeaseReturnedOnEveryPath(t *testing.T) {
	mc := newMemCluster()
	g, _ := newTestGate(t, Config{Capacity: 1, Cluster: mc, Plans: map[string]Plan{"p": {MaxConns: 1, MaxWaiting: 5}}})
	// Released with the permit.
	p := acquire(t, g, "a")
	if mc.outstanding() != 1 {
		t.Fatal("no lease with the permit")
	}
	// A waiter with its cluster slot, cancelled while it waits for global capacity.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := g.Acquire(ctx, "b"); done <- err }()
	waitUntil(t, "b holds a lease and waits", func() bool { return mc.outstanding() == 2 && g.Stat().Waiting == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if mc.outstanding() != 1 {
		t.Fatalf("cancelled waiter kept its lease: %d outstanding", mc.outstanding())
	}
	// A waiter over its cap, promoted when a's permit is released: it takes
	// a cluster slot then, and gets the permit.
	go func() {
		p, err := g.Acquire(context.Background(), "a")
		if err == nil {
			p.Release()
		}
		done <- err
	}()
	waitUntil(t, "one request waits", func() bool { return g.Stat().Waiting == 1 })
	p.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Waiters failed by Close give their leases back.
	p = acquire(t, g, "a")
	go func() { _, err := g.Acquire(context.Background(), "c"); done <- err }()
	waitUntil(t, "c holds a lease", func() bool { return mc.outstanding() == 2 })
	g.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	p.Release()
	if mc.outstanding() != 0 {
		t.Fatalf("%d leases outstanding after everything ended", mc.outstanding())
	}
	mc.mu.Lock()
	defer mc.mu.Unlock()
	for tenant, n := range mc.held {
		if n != 0 {
			t.Fatalf("%s still holds %d cluster slots", tenant, n)
		}
	}
}

// waitRecordingCluster is a memCluster that tells waits the maxWait of
// every AcquireSlot call.
type waitRecordingCluster struct {
	*memCluster
	waits chan time.Duration
}

func (c *waitRecordingCluster) AcquireSlot(ctx context.Context, tenant string, limit int, maxWait time.Duration) (ClusterLease, error) {
	c.waits <- maxWait
	return c.memCluster.AcquireSlot(ctx, tenant, limit, maxWait)
}

func TestClusterWaitIsWhatIsLeftOfMaxWait(t *testing.T) {
	// MaxWait counts from arrival for the whole wait for the tenant's cap: a
	// request that waited for a local slot asks the cluster for what is left
	// of it, not for a second MaxWait.
	rc := &waitRecordingCluster{memCluster: newMemCluster(), waits: make(chan time.Duration, 4)}
	g, clock := newTestGate(t, Config{Capacity: 4, Cluster: rc, Plans: map[string]Plan{"p": {MaxConns: 1, MaxWaiting: 1, MaxWait: time.Hour}}})
	first := acquire(t, g, "a")
	if w := recvErr(t, rc.waits); w != time.Hour {
		t.Fatalf("a request that waited nothing asked the cluster for %v, want the whole MaxWait", w)
	}
	done := make(chan error, 1)
	go func() {
		p, err := g.Acquire(context.Background(), "a")
		p.Release()
		done <- err
	}()
	waitUntil(t, "a second request waits for a's cap", func() bool { return g.Stat().Waiting == 1 })
	clock.advance(40 * time.Minute)
	first.Release() // promotes the second request to the cluster stage
	if w := recvErr(t, rc.waits); w > 20*time.Minute {
		t.Fatalf("after 40m of its 1h MaxWait in the queue, the request asked the cluster for %v", w)
	}
	if err := recvErr(t, done); err != nil {
		t.Fatal(err)
	}
}

func TestClusterWaitPastMaxWaitTimesOut(t *testing.T) {
	// A request promoted after its MaxWait passed (its timer had not fired
	// yet) takes a free cluster slot, but waits for none: a full cluster
	// times it out, not rejects it.
	rc := &waitRecordingCluster{memCluster: newMemCluster(), waits: make(chan time.Duration, 4)}
	g, clock := newTestGate(t, Config{Capacity: 4, Cluster: rc, Plans: map[string]Plan{"p": {MaxConns: 1, MaxWaiting: 1, MaxWait: time.Hour}}})
	first := acquire(t, g, "a")
	recvErr(t, rc.waits)
	done := make(chan error, 1)
	go func() { _, err := g.Acquire(context.Background(), "a"); done <- err }()
	waitUntil(t, "a second request waits for a's cap", func() bool { return g.Stat().Waiting == 1 })
	clock.advance(2 * time.Hour)
	rc.mu.Lock()
	rc.held["a"]++ // another process takes a's only cluster slot as first leaves
	rc.mu.Unlock()
	first.Release()
	if w := recvErr(t, rc.waits); w != 0 {
		t.Fatalf("a request past its MaxWait asked the cluster to wait %v", w)
	}
	err := recvErr(t, done)
	var ole *OverLimitError
	if !errors.As(err, &ole) {
		t.Fatalf("err = %v, want an *OverLimitError", err)
	}
	if s, _ := g.TenantStat("a"); s.TimedOut != 1 || s.Rejected != 0 {
		t.Fatalf("TimedOut = %d, Rejected = %d; want the request timed out", s.TimedOut, s.Rejected)
	}
}
