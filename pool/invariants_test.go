package pool

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// Tests of the interleavings that once broke the Gate's invariants. Each
// forces its interleaving with probes and hooks rather than hoping for it.

// waitUntil polls a probe until it holds, failing the test after 10 s.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// recvErr returns what ch delivers, failing the test if nothing comes in 10 s.
func recvErr[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("no result within 10s")
		var zero T
		return zero
	}
}

// heldBy reads a tenant's slot accounting under the lock.
func heldBy(g *Gate, id string) (inUse, held, clusterPending int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.tenants[id]
	if t == nil {
		return 0, 0, 0
	}
	return t.inUse, t.held(), t.clusterPending
}

// gatedCluster is a memCluster whose AcquireSlot, while blocking is on,
// announces itself on entered and waits for proceed; or panics, while
// panicking is on.
type gatedCluster struct {
	*memCluster
	blocking, panicking atomic.Bool
	entered, proceed    chan struct{}
}

func newGatedCluster() *gatedCluster {
	return &gatedCluster{memCluster: newMemCluster(), entered: make(chan struct{}, 16), proceed: make(chan struct{})}
}

func (c *gatedCluster) AcquireSlot(ctx context.Context, tenant string, limit int, maxWait time.Duration) (ClusterLease, error) {
	if c.panicking.Load() {
		panic("cluster limiter bug")
	}
	if c.blocking.Load() {
		c.entered <- struct{}{}
		select {
		case <-c.proceed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return c.memCluster.AcquireSlot(ctx, tenant, limit, maxWait)
}

// grantViolation, called by a grantHook, says what a grant of class c to
// tn would exceed: the tenant's effective limit (for the default class) or
// its class's cap, the tenant's cap, the class's share of the capacity or
// the capacity. It returns "" for a grant within all of them.
func grantViolation(g *Gate, tn *tenant, c *classState) string {
	laneInUse, laneLimit := tn.inUse, tn.limit
	if tn.wait != nil {
		l := &tn.wait.lanes[c.index]
		laneInUse, laneLimit = l.inUse, g.laneLimitLocked(l)
	}
	switch {
	case laneInUse >= laneLimit:
		return fmt.Sprintf("%s class %s: %d in use of its limit %d", tn.id, c.name, laneInUse, laneLimit)
	case tn.inUse >= tn.cap:
		return fmt.Sprintf("%s: %d in use of its cap %d", tn.id, tn.inUse, tn.cap)
	case tn.srv.classes[c.index].used >= tn.srv.classes[c.index].share:
		return fmt.Sprintf("class %s on server %q: %d in use of its share %d", c.name, tn.srv.name,
			tn.srv.classes[c.index].used, tn.srv.classes[c.index].share)
	case tn.srv.used >= tn.srv.capacity:
		return fmt.Sprintf("server %q: %d in use of %d", tn.srv.name, tn.srv.used, tn.srv.capacity)
	case g.used >= g.cfg.Capacity:
		return fmt.Sprintf("gate: %d in use of %d", g.used, g.cfg.Capacity)
	}
	return ""
}

// countViolations installs a grantHook that counts grants above a tenant's
// or a class's limits or the capacity, for the duration of the test.
func countViolations(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	grantHook = func(g *Gate, tn *tenant, c *classState) {
		if grantViolation(g, tn, c) != "" {
			n.Add(1)
		}
	}
	t.Cleanup(func() { grantHook = nil })
	return &n
}

func TestClusterAnswerAfterACutWaitsForTheNewCap(t *testing.T) {
	violations := countViolations(t)
	gc := newGatedCluster()
	g, _ := newTestGate(t, Config{Capacity: 8, Cluster: gc,
		Plans: map[string]Plan{"p": {MaxConns: 4, MaxWaiting: Unbounded}}})
	var held []Permit
	for range 3 {
		held = append(held, acquire(t, g, "a"))
	}
	gc.blocking.Store(true)
	done := make(chan struct {
		p   Permit
		err error
	}, 1)
	go func() {
		p, err := g.Acquire(context.Background(), "a")
		done <- struct {
			p   Permit
			err error
		}{p, err}
	}()
	recvErr(t, gc.entered) // the 4th holds a tenant slot and asks the cluster
	if err := g.SetTenantLimit("a", 2); err != nil {
		t.Fatal(err)
	}
	gc.proceed <- struct{}{} // the cluster says yes
	waitUntil(t, "the 4th is back in line for a tenant slot", func() bool {
		_, _, pending := heldBy(g, "a")
		s, _ := g.TenantStat("a")
		return pending == 0 && s.Waiting == 1
	})
	if inUse, _, _ := heldBy(g, "a"); inUse != 3 || violations.Load() != 0 {
		t.Fatalf("granted above the lowered cap: %d in use of 2, %d violations", inUse, violations.Load())
	}
	if n := gc.outstanding(); n != 4 {
		t.Fatalf("%d cluster leases outstanding, want 4 (the queued request keeps its lease)", n)
	}
	held[0].Release()
	held[1].Release() // 1 in use: below the cap of 2, the 4th goes
	r := recvErr(t, done)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if inUse, _, _ := heldBy(g, "a"); inUse != 2 || violations.Load() != 0 {
		t.Fatalf("%d in use, %d violations", inUse, violations.Load())
	}
	r.p.Release()
	held[2].Release()
	if s := g.Stat(); s.InUse != 0 || s.Waiting != 0 || gc.outstanding() != 0 {
		t.Fatalf("after the run: %+v, %d leases", s, gc.outstanding())
	}
}

func TestRequeuedClusterLeaseGivenBackOnTimeout(t *testing.T) {
	// The requeued request of the test above, over its plan's MaxWait,
	// fails with an over-limit error and returns its cluster lease.
	gc := newGatedCluster()
	g, err := New(Config{Capacity: 8, Cluster: gc,
		Plans: map[string]Plan{"p": {MaxConns: 2, MaxWaiting: 4, MaxWait: 20 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	a, b := acquire(t, g, "a"), acquire(t, g, "a")
	a.Release()
	gc.blocking.Store(true)
	done := make(chan error, 1)
	go func() { _, err := g.Acquire(context.Background(), "a"); done <- err }()
	recvErr(t, gc.entered)
	if err := g.SetTenantLimit("a", 1); err != nil {
		t.Fatal(err)
	}
	gc.proceed <- struct{}{}
	var ole *OverLimitError
	if err := recvErr(t, done); !errors.As(err, &ole) {
		t.Fatalf("err = %v, want an OverLimitError after MaxWait", err)
	}
	b.Release()
	if s := g.Stat(); s.InUse != 0 || s.Waiting != 0 || gc.outstanding() != 0 {
		t.Fatalf("after the timeout: %+v, %d leases", s, gc.outstanding())
	}
}

func TestIdleTenantsEvictedOnRequestPathWithLookupOrTracer(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"lookup", Config{Lookup: func(context.Context, string) (Tenant, error) { return Tenant{}, nil }}},
		{"tracer", Config{Tracer: &outcomeTracer{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Capacity, cfg.IdleTTL = 4, time.Minute
			g, clock := newTestGate(t, cfg)
			for i := range 50 {
				acquire(t, g, fmt.Sprintf("idle-%d", i)).Release()
			}
			clock.advance(2 * time.Minute)
			for range 50 * holdSampleEvery { // enough sampled sweeps to look at every idle tenant twice
				acquire(t, g, "busy").Release()
			}
			if s := g.Stat(); s.Evicted != 50 || s.Tenants != 1 {
				t.Fatalf("requests did not evict idle tenants: %+v", s)
			}
		})
	}
}

func TestAdminOperationsReleaseTheLockBetweenBatches(t *testing.T) {
	const n = 5 * adminBatch
	g, clock := newTestGate(t, Config{Capacity: 8, IdleTTL: time.Minute,
		Plans: map[string]Plan{"p": {MaxConns: 2}}})
	for i := range n {
		acquire(t, g, fmt.Sprintf("t-%d", i)).Release()
	}
	var batches int
	adminBatchHook = func() {
		batches++
		if !g.mu.TryLock() {
			t.Error("the lock is held between batches")
			return
		}
		g.mu.Unlock()
		acquire(t, g, "request-between-batches").Release() // an admission goes through
	}
	defer func() { adminBatchHook = nil }()

	if err := g.SetPlan("p", Plan{MaxConns: 3}); err != nil {
		t.Fatal(err)
	}
	if batches < n/adminBatch-1 {
		t.Fatalf("SetPlan ran in %d batches, want at least %d", batches, n/adminBatch-1)
	}
	batches = 0
	stats := g.AppendTenantStat(nil)
	if len(stats) < n || batches < n/adminBatch-1 {
		t.Fatalf("AppendTenantStat: %d tenants in %d batches", len(stats), batches)
	}
	for _, s := range stats {
		if s.Limit != 3 {
			t.Fatalf("%s has limit %d after SetPlan, want 3", s.Tenant, s.Limit)
		}
	}
	g.EvictIdle() // stamps the tenants that went idle without a clock reading
	clock.advance(2 * time.Minute)
	batches = 0
	if evicted := g.EvictIdle(); evicted < n || batches < n/adminBatch-1 {
		t.Fatalf("EvictIdle evicted %d in %d batches", evicted, batches)
	}
}

func TestPanickingLookupLeavesNothingStuck(t *testing.T) {
	var calls atomic.Int64
	var panicking atomic.Bool
	g, clock := newTestGate(t, Config{Capacity: 4, LookupTTL: time.Minute,
		Lookup: func(context.Context, string) (Tenant, error) {
			calls.Add(1)
			if panicking.Load() {
				panic("lookup bug")
			}
			return Tenant{}, nil
		}})
	acquire(t, g, "a").Release()
	clock.advance(2 * time.Minute) // the answer is stale: the next request refreshes it
	panicking.Store(true)
	for _, id := range []string{"a", "new"} { // a refresh and a first lookup
		func() {
			defer func() {
				if recover() == nil {
					t.Fatalf("%s: Lookup's panic did not reach the caller", id)
				}
			}()
			_, _ = g.Acquire(context.Background(), id)
		}()
	}
	panicking.Store(false)
	before := calls.Load()
	acquire(t, g, "a").Release()
	if calls.Load() != before+1 {
		t.Fatal("the refresh is stuck after a panicking Lookup: no new Lookup call")
	}
	if s := g.Stat(); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("after the panics: %+v", s)
	}
}

func TestPanickingClusterLimiterLeavesNoSlotHeld(t *testing.T) {
	gc := newGatedCluster()
	g, _ := newTestGate(t, Config{Capacity: 4, Cluster: gc, Plans: map[string]Plan{"p": {MaxConns: 1, MaxWaiting: 1}}})
	gc.panicking.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("AcquireSlot's panic did not reach the caller")
			}
		}()
		_, _ = g.Acquire(context.Background(), "a")
	}()
	gc.panicking.Store(false)
	if _, held, pending := heldBy(g, "a"); held != 0 || pending != 0 || g.Stat().Waiting != 0 {
		t.Fatalf("after the panic: held %d, pending %d, %+v", held, pending, g.Stat())
	}
	acquire(t, g, "a").Release() // its single slot is free again
}

type nopTracer struct{}

func (nopTracer) TraceAcquireStart(ctx context.Context, _ *Gate, _ TraceAcquireStartData) context.Context {
	return ctx
}
func (nopTracer) TraceAcquireEnd(context.Context, *Gate, TraceAcquireEndData) {}

type panickingTracer struct{ nopTracer }

func (panickingTracer) TraceAcquireEnd(context.Context, *Gate, TraceAcquireEndData) {
	panic("tracer bug")
}

func TestPanickingTracerLeavesNoPermitHeld(t *testing.T) {
	g, _ := newTestGate(t, Config{Capacity: 4, Tracer: panickingTracer{}})
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the tracer's panic did not reach the caller")
			}
		}()
		_, _ = g.Acquire(context.Background(), "a")
	}()
	if s := g.Stat(); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("the permit nobody received is still held: %+v", s)
	}
}

func TestSpuriousWakeIsNotAMaxWaitTimeout(t *testing.T) {
	g, _ := newTestGate(t, Config{Capacity: 4, Plans: map[string]Plan{"p": {MaxConns: 1, MaxWaiting: 1, MaxWait: time.Hour}}})
	holder := acquire(t, g, "a")
	done := make(chan error, 1)
	go func() {
		p, err := g.Acquire(context.Background(), "a")
		p.Release()
		done <- err
	}()
	waitUntil(t, "a second request waits", func() bool { return g.Stat().Waiting == 1 })
	woke := make(chan struct{}, 1)
	wakeIgnoredHook = func() { woke <- struct{}{} }
	defer func() { wakeIgnoredHook = nil }()
	g.mu.Lock()
	g.tenants["a"].wait.lanes[0].capQ.head.v.signal() // a wake that changes nothing
	g.mu.Unlock()
	select {
	case err := <-done:
		t.Fatalf("a leftover wake ended the wait: %v", err)
	case <-woke:
	case <-time.After(10 * time.Second):
		t.Fatal("the wake was never seen")
	}
	holder.Release()
	if err := recvErr(t, done); err != nil {
		t.Fatal(err)
	}
}

// giveBackRacedGrant makes a request of tenant id wait behind holder, the
// only permit of a one-permit gate, then releases holder as that request's
// context is cancelled, so the grant races the cancellation and is given
// back unheld. The request must fail with context.Canceled.
func giveBackRacedGrant(t *testing.T, g *Gate, holder Permit, id string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := g.Acquire(ctx, id); done <- err }()
	waitUntil(t, id+" waits", func() bool { return g.Stat().Waiting == 1 })
	g.mu.Lock()
	cancel()
	g.releaseLocked(holder.s, true) // grants the waiter, which wakes cancelled and gives it back
	g.mu.Unlock()
	if err := recvErr(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

func TestGrantGivenBackDoesNotFeedRetryAfter(t *testing.T) {
	g, clock := newTestGate(t, Config{Capacity: 1, Tracer: nopTracer{}}) // traced: every hold measured
	p := acquire(t, g, "b")
	clock.advance(time.Second)
	p.Release()
	giveBackRacedGrant(t, g, acquire(t, g, "a"), "b")
	if s, _ := g.TenantStat("b"); s.AvgHold != time.Second {
		t.Fatalf("AvgHold = %v after a grant given back unused, want 1s", s.AvgHold)
	}
}

func TestMaxReservedMustLeaveSharedCapacity(t *testing.T) {
	if _, err := New(Config{Capacity: 4, MaxReserved: 4}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("MaxReserved == Capacity: err = %v, want ErrInvalidConfig", err)
	}
}

func TestClassClusterAnswerAfterACutWaitsInItsLane(t *testing.T) {
	// A batch request holding one of acme's batch slots asks the cluster;
	// meanwhile acme's cap is cut below what it holds. When the cluster says
	// yes, the request goes back to the front of its own lane's queue
	// (keeping its lease), not to the default class's, and nothing is
	// granted above the tenant's cap or the class's.
	violations := countViolations(t)
	gc := newGatedCluster()
	g, _ := newTestGate(t, Config{Capacity: 8, Cluster: gc,
		Plans:   map[string]Plan{"p": {MaxConns: 4, MaxWaiting: Unbounded}},
		Classes: map[string]Class{"batch": {MaxConns: 3, MaxWaiting: Unbounded, MaxShare: 1}}})
	batch := WithClass(context.Background(), "batch")
	var held []Permit
	for range 2 {
		p, err := g.Acquire(batch, "acme")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	gc.blocking.Store(true)
	done := make(chan error, 1)
	go func() {
		p, err := g.Acquire(batch, "acme")
		p.Release()
		done <- err
	}()
	recvErr(t, gc.entered)
	if err := g.SetTenantLimit("acme", 2); err != nil {
		t.Fatal(err)
	}
	gc.proceed <- struct{}{}
	waitUntil(t, "the batch request is back in its lane's queue", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		lanes := g.tenants["acme"].wait.lanes
		return lanes[1].capQ.n == 1 && lanes[0].capQ.n == 0 && lanes[1].clusterPending == 0
	})
	if n := gc.outstanding(); n != 3 || violations.Load() != 0 {
		t.Fatalf("%d leases outstanding (want 3: the queued request keeps its lease), %d violations", n, violations.Load())
	}
	held[0].Release() // 1 held, below the cap of 2: the batch request goes
	if err := recvErr(t, done); err != nil {
		t.Fatal(err)
	}
	held[1].Release()
	if s := g.Stat(); s.InUse != 0 || s.Waiting != 0 || gc.outstanding() != 0 || violations.Load() != 0 {
		t.Fatalf("after the run: %+v, %d leases, %d violations", s, gc.outstanding(), violations.Load())
	}
}

func TestCutDemotesNamedClassesBeforeTheDefault(t *testing.T) {
	// With acme's requests of both classes waiting for capacity, a cut of
	// its cap sends the batch ones back to their queue first, so the slots
	// left go to the default class.
	g, _ := newTestGate(t, Config{Capacity: 6,
		Plans:   map[string]Plan{"p": {MaxConns: 6, MaxWaiting: Unbounded}},
		Classes: map[string]Class{"batch": {MaxConns: 3, MaxWaiting: Unbounded, MaxShare: 1}}})
	var blockers []Permit
	for range 6 {
		blockers = append(blockers, acquire(t, g, "other"))
	}
	batch := WithClass(context.Background(), "batch")
	results := make(chan error, 4)
	for _, ctx := range []context.Context{batch, batch, context.Background(), context.Background()} {
		go func() {
			p, err := g.Acquire(ctx, "acme")
			p.Release()
			results <- err
		}()
	}
	waitUntil(t, "acme's four wait for capacity", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		t := g.tenants["acme"]
		return t != nil && t.wait != nil && t.wait.lanes[0].globalQ.n == 2 && t.wait.lanes[1].globalQ.n == 2
	})
	if err := g.SetTenantLimit("acme", 2); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	lanes := g.tenants["acme"].wait.lanes
	def, bat := lanes[0].globalQ.n, lanes[1].globalQ.n
	g.mu.Unlock()
	if def != 2 || bat != 0 {
		t.Fatalf("after the cut %d default and %d batch requests hold slots, want 2 and 0", def, bat)
	}
	for _, p := range blockers {
		p.Release()
	}
	for range 4 {
		if err := recvErr(t, results); err != nil {
			t.Fatal(err)
		}
	}
}
