package pool

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// Tests that every path out of admission (Close, a cut of the cap, a
// misbehaving ClusterLimiter) gives back what the request held: its tenant
// slot, its place in the waiting count and its cluster lease.

// assertNothingHeld checks that a's requests hold no tenant slot and that no
// request waits; leases, when mc is set, says how many cluster leases may be
// outstanding.
func assertNothingHeld(t *testing.T, g *Gate, id string, inUse int, mc *memCluster, leases int) {
	t.Helper()
	if gotInUse, held, pending := heldBy(g, id); gotInUse != inUse || held != inUse || pending != 0 {
		t.Fatalf("%s: %d in use, %d tenant slots held, %d asking the cluster; want %d, %d, 0",
			id, gotInUse, held, pending, inUse, inUse)
	}
	if s := g.Stat(); s.Waiting != 0 {
		t.Fatalf("%d requests still counted as waiting", s.Waiting)
	}
	if mc != nil && mc.outstanding() != leases {
		t.Fatalf("%d cluster leases outstanding, want %d", mc.outstanding(), leases)
	}
}

func TestCloseFailsRequestsAskingTheCluster(t *testing.T) {
	for _, how := range []string{"first request", "promoted waiter"} {
		t.Run(how, func(t *testing.T) {
			gc := newGatedCluster()
			g, _ := newTestGate(t, Config{Capacity: 4, Cluster: gc,
				Plans: map[string]Plan{"p": {MaxConns: 1, MaxWaiting: Unbounded}}})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel() // only ends the request if Close did not
			done := make(chan error, 1)
			var holder Permit
			if how == "promoted waiter" {
				holder = acquire(t, g, "a")
				go func() { _, err := g.Acquire(ctx, "a"); done <- err }()
				waitUntil(t, "a request waits for a's cap", func() bool { return g.Stat().Waiting == 1 })
				gc.blocking.Store(true)
				holder.Release() // the waiter is promoted and asks the cluster
			} else {
				gc.blocking.Store(true)
				go func() { _, err := g.Acquire(ctx, "a"); done <- err }()
			}
			recvErr(t, gc.entered) // it is inside AcquireSlot, holding a's only slot
			g.Close()
			if err := recvErr(t, done); !errors.Is(err, ErrClosed) {
				t.Fatalf("err = %v, want ErrClosed", err)
			}
			assertNothingHeld(t, g, "a", 0, gc.memCluster, 0)
		})
	}
}

func TestCloseFailsRequestsWaitingForAFullClusterSlot(t *testing.T) {
	// The limiter itself waits (the slot is held by another process); Close
	// must end that wait too, and the lease the limiter may hand over late
	// must be given back.
	mc := newMemCluster()
	g, _ := newTestGate(t, Config{Capacity: 4, Cluster: mc,
		Plans: map[string]Plan{"p": {MaxConns: 2, MaxWaiting: Unbounded}}})
	mc.held["a"] = 2
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := g.Acquire(ctx, "a"); done <- err }()
	waitUntil(t, "a asks the cluster", func() bool { _, _, pending := heldBy(g, "a"); return pending == 1 })
	g.Close()
	if err := recvErr(t, done); !errors.Is(err, ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
	assertNothingHeld(t, g, "a", 0, mc, 0)
}

func TestDemotedWaiterKeepsItsMaxWait(t *testing.T) {
	// acme's second request is within its cap and waits for global capacity
	// (held by other); a cut of acme's cap sends it back to wait for the cap,
	// where the plan's MaxWait bounds it from when it arrived.
	const maxWait = 20 * time.Millisecond
	g, err := New(Config{Capacity: 2, Plans: map[string]Plan{"p": {MaxConns: 2, MaxWaiting: 5, MaxWait: maxWait}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	a, o := acquire(t, g, "acme"), acquire(t, g, "other")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // only ends the request if MaxWait did not
	ch := acquireAsync(ctx, g, "acme")
	waitUntil(t, "acme waits for capacity", func() bool { return g.Stat().Waiting == 1 })
	if err := g.SetTenantLimit("acme", 1); err != nil {
		t.Fatal(err)
	}
	r := recvErr(t, ch)
	var ole *OverLimitError
	if !errors.As(r.err, &ole) || ole.Waited < maxWait {
		t.Fatalf("err = %v, want an *OverLimitError after MaxWait", r.err)
	}
	if s, _ := g.TenantStat("acme"); s.TimedOut != 1 || s.Cancelled != 0 || s.Waiting != 0 || s.InUse != 1 {
		t.Fatalf("acme = %+v", s)
	}
	a.Release()
	o.Release()
	assertNothingHeld(t, g, "acme", 0, nil, 0)
}

func TestDemotedWaiterPastItsMaxWaitTimesOutAtOnce(t *testing.T) {
	// A request waits for global capacity longer than MaxWait (which does
	// not bound that wait); once a cut sends it back to wait for its cap,
	// its MaxWait has run out: it fails at once, not at its context's end.
	g, err := New(Config{Capacity: 2, Plans: map[string]Plan{"p": {MaxConns: 2, MaxWaiting: 5, MaxWait: time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	a, o := acquire(t, g, "acme"), acquire(t, g, "other")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := acquireAsync(ctx, g, "acme")
	waitUntil(t, "acme waits for capacity", func() bool { return g.Stat().Waiting == 1 })
	start := g.clock()
	waitUntil(t, "MaxWait passes", func() bool { return g.clock()-start > int64(5*time.Millisecond) })
	if err := g.SetTenantLimit("acme", 1); err != nil {
		t.Fatal(err)
	}
	var ole *OverLimitError
	if r := recvErr(t, ch); !errors.As(r.err, &ole) {
		t.Fatalf("err = %v, want an *OverLimitError", r.err)
	}
	a.Release()
	o.Release()
	assertNothingHeld(t, g, "acme", 0, nil, 0)
}

func TestAdaptiveCutKeepsTheDemotedWaitersMaxWait(t *testing.T) {
	// The cut comes from the adaptive controller (inflated holds), not from
	// SetTenantLimit: the request it sends back to wait for the cap keeps
	// its MaxWait all the same.
	g, clock := newTestGate(t, Config{Capacity: 6, MaxReserved: 1,
		Plans:    map[string]Plan{"p": {MaxConns: 6, MaxWaiting: Unbounded, MaxWait: 20 * time.Millisecond}},
		Adaptive: Adaptive{Enabled: true, MinConns: 2}}) // the floor the steps below count from
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p1, p2 := acquire(t, g, "a"), acquire(t, g, "a")
	next := acquireAsync(ctx, g, "a") // waits, so the tenant does not empty and restart at 2
	waitUntil(t, "a third waits at the floor", func() bool { return g.Stat().Waiting == 1 })
	clock.advance(10 * time.Millisecond)
	p1.Release()
	p3 := recvErr(t, next)
	if p3.err != nil {
		t.Fatal(p3.err)
	}
	p2.Release() // a clean window at the floor: the limit doubles to 4
	clock.advance(time.Millisecond)
	h := []Permit{p3.p, acquire(t, g, "a"), acquire(t, g, "a"), acquire(t, g, "a")}
	clock.advance(40 * time.Millisecond) // inflated: 4x the baseline
	h[0].Release()
	h[1].Release() // half a window: no cut yet
	others := []Permit{acquire(t, g, "o1"), acquire(t, g, "o1"), acquire(t, g, "o2"), acquire(t, g, "o2")}
	w1 := acquireAsync(ctx, g, "a")
	waitUntil(t, "one waits for capacity", func() bool { return g.Stat().Waiting == 1 })
	w2 := acquireAsync(ctx, g, "a")
	waitUntil(t, "two wait for capacity", func() bool { return g.Stat().Waiting == 2 })
	h[2].Release() // the third inflated hold of four: cut to 2, w2 goes back to wait for the cap
	r1 := recvErr(t, w1)
	if r1.err != nil {
		t.Fatal(r1.err)
	}
	if s, _ := g.TenantStat("a"); s.EffectiveLimit != 2 {
		t.Fatalf("effective limit %d, want the cut to 2", s.EffectiveLimit)
	}
	var ole *OverLimitError
	if r2 := recvErr(t, w2); !errors.As(r2.err, &ole) {
		t.Fatalf("err = %v, want an *OverLimitError after MaxWait", r2.err)
	}
	if s, _ := g.TenantStat("a"); s.TimedOut != 1 || s.Waiting != 0 {
		t.Fatalf("a = %+v", s)
	}
	for _, p := range append(others, h[3], r1.p) {
		p.Release()
	}
	assertNothingHeld(t, g, "a", 0, nil, 0)
}

// leaseCluster hands out leases whose Local panics while panicLocal is on,
// or answers nil, nil while noLease is on.
type leaseCluster struct {
	*memCluster
	panicLocal, noLease atomic.Bool
}

type panickyLease struct{ *memLease }

func (l panickyLease) Local() bool { panic("lease bug") }

func (c *leaseCluster) AcquireSlot(ctx context.Context, tenant string, limit int, maxWait time.Duration) (ClusterLease, error) {
	if c.noLease.Load() {
		return nil, nil
	}
	l, err := c.memCluster.AcquireSlot(ctx, tenant, limit, maxWait)
	if err == nil && c.panicLocal.Load() {
		return panickyLease{l.(*memLease)}, nil
	}
	return l, err
}

func TestPanickingLeaseLocalLeavesNothingHeld(t *testing.T) {
	lc := &leaseCluster{memCluster: newMemCluster()}
	g, _ := newTestGate(t, Config{Capacity: 4, Cluster: lc, Plans: map[string]Plan{"p": {MaxConns: 1}}})
	lc.panicLocal.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Local's panic did not reach the caller")
			}
		}()
		_, _ = g.Acquire(context.Background(), "a")
	}()
	lc.panicLocal.Store(false)
	if !g.mu.TryLock() {
		g.mu.Unlock() // for the cleanup's Close
		t.Fatal("the Gate's lock is held after the panic")
	}
	g.mu.Unlock()
	assertNothingHeld(t, g, "a", 0, lc.memCluster, 0)
	acquire(t, g, "a").Release() // its single slot is free again
}

func TestClusterLimiterAnsweringNothingFailsClosed(t *testing.T) {
	lc := &leaseCluster{memCluster: newMemCluster()}
	g, _ := newTestGate(t, Config{Capacity: 4, Cluster: lc, Plans: map[string]Plan{"p": {MaxConns: 1}}})
	lc.noLease.Store(true)
	_, err := g.Acquire(context.Background(), "a")
	if err == nil || g.Stat().ClusterErrors != 1 {
		t.Fatalf("err = %v, ClusterErrors %d; want an error counted as a cluster error", err, g.Stat().ClusterErrors)
	}
	lc.noLease.Store(false)
	assertNothingHeld(t, g, "a", 0, lc.memCluster, 0)
	acquire(t, g, "a").Release()
}

// releasePanicCluster hands out leases whose Release panics, but for the first.
type releasePanicCluster struct {
	*memCluster
	n atomic.Int64
}

type releasePanicLease struct{ *memLease }

func (l releasePanicLease) Release() {
	l.memLease.Release()
	panic("release bug")
}

func (c *releasePanicCluster) AcquireSlot(ctx context.Context, tenant string, limit int, maxWait time.Duration) (ClusterLease, error) {
	l, err := c.memCluster.AcquireSlot(ctx, tenant, limit, maxWait)
	if err == nil && c.n.Add(1) >= 2 {
		return releasePanicLease{l.(*memLease)}, nil
	}
	return l, err
}

func TestClosePanickingLeaseReleaseDoesNotLeakTheOthers(t *testing.T) {
	rc := &releasePanicCluster{memCluster: newMemCluster()}
	g, _ := newTestGate(t, Config{Capacity: 1, Cluster: rc, Plans: map[string]Plan{"p": {MaxConns: 1, MaxWaiting: 1}}})
	holder := acquire(t, g, "h") // lease 1; takes all capacity
	var done [3]chan error
	for i, id := range []string{"a", "b", "c"} { // leases 2, 3 and 4, each panicking on Release
		done[i] = make(chan error, 1)
		go func() { _, err := g.Acquire(context.Background(), id); done[i] <- err }()
		waitUntil(t, id+" waits for capacity with its lease", func() bool {
			_, held, pending := heldBy(g, id)
			return held == 1 && pending == 0 && rc.outstanding() == i+2
		})
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the lease's panic did not reach Close's caller")
			}
		}()
		g.Close()
	}()
	for i := range done {
		if err := recvErr(t, done[i]); !errors.Is(err, ErrClosed) {
			t.Fatalf("err = %v, want ErrClosed", err)
		}
	}
	holder.Release()
	if n := rc.outstanding(); n != 0 {
		t.Fatalf("%d cluster leases outstanding after Close", n)
	}
}
