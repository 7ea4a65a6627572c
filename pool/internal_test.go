package pool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock replaces a Gate's clock, so tests of TTLs do not sleep.
type fakeClock struct{ now atomic.Int64 }

func (c *fakeClock) advance(d time.Duration) { c.now.Add(int64(d)) }

func newTestGate(t *testing.T, cfg Config) (*Gate, *fakeClock) {
	t.Helper()
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	c := &fakeClock{}
	c.now.Store(1)
	g.clock = c.now.Load
	return g, c
}

func acquire(t *testing.T, g *Gate, id string) Permit {
	t.Helper()
	p, err := g.Acquire(context.Background(), id)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", id, err)
	}
	return p
}

func tracked(g *Gate, id string) bool {
	_, ok := g.TenantStat(id)
	return ok
}

func TestIdleTenantEvictedAfterTTL(t *testing.T) {
	g, clock := newTestGate(t, Config{Capacity: 4, IdleTTL: time.Minute})
	acquire(t, g, "a").Release() // uncontended: idle without a clock reading
	clock.advance(30 * time.Second)
	if n := g.EvictIdle(); n != 0 || !tracked(g, "a") {
		t.Fatalf("evicted %d before IdleTTL", n)
	}
	clock.advance(59 * time.Second) // 59s after it was stamped idle
	if n := g.EvictIdle(); n != 0 {
		t.Fatalf("evicted %d before IdleTTL", n)
	}
	clock.advance(time.Second)
	if n := g.EvictIdle(); n != 1 || tracked(g, "a") {
		t.Fatalf("evicted %d, tracked=%v; want a evicted after IdleTTL", n, tracked(g, "a"))
	}
	if s := g.Stat(); s.Evicted != 1 || s.Tenants != 0 || s.Acquired != 1 {
		t.Fatalf("Stat = %+v: totals must survive eviction", s)
	}
}

func TestBusyTenantsAreNotEvicted(t *testing.T) {
	g, clock := newTestGate(t, Config{Capacity: 1, IdleTTL: time.Minute, Plans: map[string]Plan{"p": {MaxConns: 1, MaxWaiting: 1}}})
	held := acquire(t, g, "holder")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := g.Acquire(ctx, "waiter"); done <- err }()
	waitUntil(t, "one request waits", func() bool { return g.Stat().Waiting == 1 })
	for range 3 {
		clock.advance(time.Hour)
		g.EvictIdle()
	}
	if !tracked(g, "holder") || !tracked(g, "waiter") {
		t.Fatal("a tenant in use or waiting was evicted")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	held.Release()
}

func TestIdleEvictionHappensLazilyOnRequests(t *testing.T) {
	g, clock := newTestGate(t, Config{Capacity: 4, IdleTTL: time.Minute})
	acquire(t, g, "gone").Release()
	clock.advance(2 * time.Minute)
	for range 2 * holdSampleEvery { // a sampled acquire stamps, a later one evicts
		acquire(t, g, "busy").Release()
		clock.advance(2 * time.Minute)
	}
	if tracked(g, "gone") {
		t.Fatal("idle tenant not evicted by sweeps on the request path")
	}
}

func TestMaxTenantsBoundsState(t *testing.T) {
	g, _ := newTestGate(t, Config{Capacity: 10, MaxTenants: 3, IdleTTL: time.Hour})
	a := acquire(t, g, "a")
	acquire(t, g, "b")
	acquire(t, g, "c")
	if _, err := g.Acquire(context.Background(), "d"); !errors.Is(err, ErrTooManyTenants) {
		t.Fatalf("err = %v, want ErrTooManyTenants", err)
	}
	if tracked(g, "d") || g.Stat().Tenants != 3 {
		t.Fatal("a refused tenant was tracked")
	}
	a.Release() // a is idle now (long before its TTL): it makes room
	acquire(t, g, "d")
	if tracked(g, "a") || g.Stat().Tenants != 3 {
		t.Fatalf("tracked a=%v tenants=%d; want a evicted early to make room", tracked(g, "a"), g.Stat().Tenants)
	}
}

func TestEvictingReservedTenantFreesItsReservation(t *testing.T) {
	g, clock := newTestGate(t, Config{
		Capacity: 2, MaxReserved: 1, IdleTTL: time.Minute,
		Plans:       map[string]Plan{"ent": {MaxConns: 2, ReservedConns: 1}, "std": {MaxConns: 2, MaxWaiting: 1}},
		DefaultPlan: "std",
		Lookup: func(_ context.Context, id string) (Tenant, error) {
			if id == "ent" {
				return Tenant{Plan: "ent"}, nil
			}
			return Tenant{}, nil
		},
	})
	acquire(t, g, "ent").Release()
	s1 := acquire(t, g, "std")
	done := make(chan Permit, 1)
	go func() { p, _ := g.Acquire(context.Background(), "std"); done <- p }()
	waitUntil(t, "one request waits: the last free unit is ent's", func() bool { return g.Stat().Waiting == 1 })
	clock.advance(2 * time.Minute)
	g.EvictIdle() // stamps ent
	clock.advance(2 * time.Minute)
	g.EvictIdle() // evicts ent: its reserved unit goes to std's waiter
	p := <-done
	if s := g.Stat(); s.Reserved != 0 || s.InUse != 2 {
		t.Fatalf("Stat = %+v", s)
	}
	p.Release()
	s1.Release()
}

func TestLookupCachedForTTL(t *testing.T) {
	var calls atomic.Int32
	plan := atomic.Value{}
	plan.Store("std")
	g, clock := newTestGate(t, Config{
		Capacity: 10, LookupTTL: time.Minute, DefaultPlan: "std",
		Plans: map[string]Plan{"std": {MaxConns: 2}, "ent": {MaxConns: 8}},
		Lookup: func(_ context.Context, id string) (Tenant, error) {
			calls.Add(1)
			return Tenant{Plan: plan.Load().(string)}, nil
		},
	})
	acquire(t, g, "acme").Release()
	acquire(t, g, "acme").Release()
	if calls.Load() != 1 {
		t.Fatalf("Lookup called %d times within its TTL, want 1", calls.Load())
	}
	plan.Store("ent") // the tenant upgrades
	clock.advance(61 * time.Second)
	acquire(t, g, "acme").Release()
	if s, _ := g.TenantStat("acme"); calls.Load() != 2 || s.Limit != 8 || s.Plan != "ent" {
		t.Fatalf("after TTL: calls=%d stats=%+v", calls.Load(), s)
	}
	plan.Store("std")
	g.InvalidateTenant("acme")
	acquire(t, g, "acme").Release()
	if s, _ := g.TenantStat("acme"); calls.Load() != 3 || s.Limit != 2 {
		t.Fatalf("after InvalidateTenant: calls=%d stats=%+v", calls.Load(), s)
	}
}

func TestGrantRacingCancellationIsGivenBack(t *testing.T) {
	// Force the race: the waiter is granted and its context cancelled while
	// it is still parked, so it wakes to both. It must give the permit back.
	g, _ := newTestGate(t, Config{Capacity: 1})
	holder := acquire(t, g, "a")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		p, err := g.Acquire(ctx, "b")
		if err == nil {
			p.Release()
		}
		done <- err
	}()
	waitUntil(t, "one request waits", func() bool { return g.Stat().Waiting == 1 })
	g.mu.Lock()
	cancel()
	g.releaseLocked(holder.s, true) // grants b's waiter under the same lock
	g.mu.Unlock()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want Canceled", err)
	}
	s, _ := g.TenantStat("b")
	if s.Acquired != 0 || s.Cancelled != 1 || s.InUse != 0 {
		t.Fatalf("b = %+v: the raced grant must be undone", s)
	}
	if st := g.Stat(); st.InUse != 0 || st.Waiting != 0 {
		t.Fatalf("Stat = %+v: the permit was lost", st)
	}
	acquire(t, g, "c").Release()
}

func TestGrantRacingCancellationManyTimes(t *testing.T) {
	g, _ := newTestGate(t, Config{Capacity: 1})
	var got, cancelled int
	for range 2000 {
		holder := acquire(t, g, "a")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			p, err := g.Acquire(ctx, "b")
			if err == nil {
				p.Release()
			}
			done <- err
		}()
		waitUntil(t, "one request waits", func() bool { return g.Stat().Waiting == 1 })
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); holder.Release() }()
		go func() { defer wg.Done(); cancel() }()
		wg.Wait()
		if err := <-done; err == nil {
			got++
		} else if errors.Is(err, context.Canceled) {
			cancelled++
		} else {
			t.Fatal(err)
		}
		if s := g.Stat(); s.InUse != 0 || s.Waiting != 0 {
			t.Fatalf("after a race: %+v", s)
		}
	}
	t.Logf("granted %d, cancelled %d", got, cancelled)
}

func TestCloseKeepsIdleListsIntact(t *testing.T) {
	// A tenant that once waited (so has contention state) and is idle at
	// Close must not be put on an idle list twice.
	g, clock := newTestGate(t, Config{Capacity: 1, IdleTTL: time.Minute, Plans: map[string]Plan{"p": {MaxConns: 1, MaxWaiting: 1}}})
	held := acquire(t, g, "a")
	done := make(chan Permit, 1)
	go func() { p, _ := g.Acquire(context.Background(), "b"); done <- p }()
	waitUntil(t, "one request waits", func() bool { return g.Stat().Waiting == 1 })
	held.Release()
	(<-done).Release() // b waited once, and is idle now
	g.Close()
	g.EvictIdle() // stamps both
	clock.advance(time.Hour)
	if n := g.EvictIdle(); n != 2 || g.Stat().Tenants != 0 {
		t.Fatalf("evicted %d, %d tenants left; want both evicted", n, g.Stat().Tenants)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.idle.n != 0 || g.fresh.n != 0 || g.idle.head != nil || g.fresh.head != nil {
		t.Fatalf("idle lists corrupted: idle %d fresh %d", g.idle.n, g.fresh.n)
	}
}

// TestLookupFailuresAreCached: a flood of requests for a tenant whose Lookup
// fails reaches Lookup once per LookupErrorTTL, each request getting the
// same error; other tenants, a tenant whose answer is cached, a request
// whose own context ended during Lookup and InvalidateTenant are not
// affected.
func TestLookupFailuresAreCached(t *testing.T) {
	errUnknown := errors.New("no such account")
	var mu sync.Mutex
	calls := map[string]int{}
	failing := map[string]bool{"ghost": true}
	g, clock := newTestGate(t, Config{
		Capacity:       4,
		Plans:          map[string]Plan{"std": {MaxConns: 2}},
		LookupErrorTTL: 2 * time.Second,
		Lookup: func(ctx context.Context, id string) (Tenant, error) {
			mu.Lock()
			defer mu.Unlock()
			calls[id]++
			switch {
			case id == "typo":
				return Tenant{Plan: "nope"}, nil
			case id == "slow":
				<-ctx.Done()
				return Tenant{}, ctx.Err()
			case failing[id]:
				return Tenant{}, errUnknown
			}
			return Tenant{}, nil
		},
	})
	count := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return calls[id]
	}
	for range 100 {
		if _, err := g.Acquire(context.Background(), "ghost"); !errors.Is(err, errUnknown) {
			t.Fatalf("ghost: %v, want the Lookup's error", err)
		}
		if _, err := g.Acquire(context.Background(), "typo"); !errors.Is(err, ErrUnknownPlan) {
			t.Fatalf("typo: %v, want ErrUnknownPlan", err)
		}
		acquire(t, g, "acme").Release()
	}
	if n := count("ghost"); n != 1 {
		t.Errorf("100 requests for ghost called Lookup %d times, want 1", n)
	}
	if n := count("typo"); n != 1 {
		t.Errorf("100 requests for typo called Lookup %d times, want 1", n)
	}
	if n := count("acme"); n != 1 {
		t.Errorf("acme's cached answer: Lookup called %d times, want 1", n)
	}
	if s := g.Stat(); s.Tenants != 1 {
		t.Errorf("%d tenants tracked, want acme only", s.Tenants)
	}

	// Past the TTL, Lookup is asked again; its answer now admits ghost.
	clock.advance(2*time.Second + 1)
	mu.Lock()
	failing["ghost"] = false
	mu.Unlock()
	acquire(t, g, "ghost").Release()
	if n := count("ghost"); n != 2 {
		t.Errorf("after LookupErrorTTL: %d Lookup calls for ghost, want 2", n)
	}

	// InvalidateTenant forgets a failure at once.
	mu.Lock()
	failing["later"] = true
	mu.Unlock()
	if _, err := g.Acquire(context.Background(), "later"); !errors.Is(err, errUnknown) {
		t.Fatalf("later: %v", err)
	}
	mu.Lock()
	failing["later"] = false
	mu.Unlock()
	g.InvalidateTenant("later")
	acquire(t, g, "later").Release()

	// A request that gave up during Lookup leaves nothing cached.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 3 {
		if _, err := g.Acquire(ctx, "slow"); err == nil {
			t.Fatal("slow: admitted with a done context")
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, _ = g.Acquire(ctx, "slow")
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel2()
	_, _ = g.Acquire(ctx2, "slow")
	if n := count("slow"); n != 2 {
		t.Errorf("requests whose contexts ended in Lookup: %d Lookup calls, want 2 (nothing cached)", n)
	}
}

// TestLookupFailuresBounded: cached failures never exceed MaxTenants, so a
// flood of distinct unknown IDs cannot grow memory without limit.
func TestLookupFailuresBounded(t *testing.T) {
	g, _ := newTestGate(t, Config{
		Capacity:   4,
		MaxTenants: 10,
		Lookup: func(ctx context.Context, id string) (Tenant, error) {
			return Tenant{}, errors.New("unknown")
		},
	})
	for i := range 1000 {
		_, _ = g.Acquire(context.Background(), "ghost-"+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	g.mu.Lock()
	n, q := len(g.failed.byID), len(g.failed.order)-g.failed.head
	g.mu.Unlock()
	if n > 10 || q > 10 {
		t.Errorf("%d failures cached, %d queued; want at most MaxTenants 10", n, q)
	}
}
