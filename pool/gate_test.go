package pool_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

func TestAcquireReleaseCounts(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"std": {MaxConns: 2}}})
	a := mustAcquire(t, g, "acme")
	b := mustAcquire(t, g, "acme")
	s, ok := g.TenantStat("acme")
	if !ok || s.InUse != 2 || s.Limit != 2 || s.Plan != "std" || s.Acquired != 2 {
		t.Fatalf("TenantStat = %+v, %v", s, ok)
	}
	a.Release()
	a.Release() // idempotent
	copyOfB := b
	b.Release()
	copyOfB.Release() // a copy of a released permit is released too
	if s := g.Stat(); s.InUse != 0 || s.Acquired != 2 {
		t.Fatalf("Stat = %+v", s)
	}
	// The slots really came back: the tenant can hold its cap again.
	mustAcquire(t, g, "acme").Release()
	mustAcquire(t, g, "acme")
	mustAcquire(t, g, "acme")
	if s, _ := g.TenantStat("acme"); s.InUse != 2 {
		t.Fatalf("InUse = %d after reacquiring, want 2", s.InUse)
	}
	var zero pool.Permit
	zero.Release() // the zero Permit is valid
}

func TestReleaseOfRecycledPermitDoesNotReleaseNewHolder(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 1, Plans: map[string]pool.Plan{"p": {MaxConns: 1}}})
	old := mustAcquire(t, g, "a")
	old.Release()
	cur := mustAcquire(t, g, "b") // likely reuses old's state
	old.Release()                 // stale: must not free b's slot
	if s := g.Stat(); s.InUse != 1 {
		t.Fatalf("stale Release freed the current holder: InUse = %d", s.InUse)
	}
	cur.Release()
	assertDrained(t, g)
}

func TestRejectOverCap(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 10, Plans: map[string]pool.Plan{"free": {MaxConns: 2}}})
	mustAcquire(t, g, "noisy")
	mustAcquire(t, g, "noisy")
	start := time.Now()
	_, err := g.Acquire(context.Background(), "noisy")
	took := time.Since(start)
	var ole *pool.OverLimitError
	if !errors.As(err, &ole) || !errors.Is(err, pool.ErrOverLimit) {
		t.Fatalf("err = %v, want *OverLimitError matching ErrOverLimit", err)
	}
	if ole.Tenant != "noisy" || ole.Limit != 2 || ole.RetryAfter <= 0 || ole.Waited != 0 {
		t.Fatalf("OverLimitError = %+v", ole)
	}
	if took > time.Second {
		t.Fatalf("rejection took %v: it must not wait", took)
	}
	// Another tenant is not affected by noisy's cap.
	mustAcquire(t, g, "quiet")
	if s, _ := g.TenantStat("noisy"); s.Rejected != 1 || s.InUse != 2 || s.Waiting != 0 {
		t.Fatalf("noisy stats = %+v", s)
	}
}

func TestWaitForTenantCapHoldsNoGlobalCapacity(t *testing.T) {
	// Capacity 2; noisy's cap is 1 and 5 of its requests queue over it. If
	// waiting for its cap held global capacity, quiet could not get the
	// second unit.
	g := mustNew(t, pool.Config{Capacity: 2, Plans: map[string]pool.Plan{"p": {MaxConns: 1, MaxWaiting: 5}}})
	held := mustAcquire(t, g, "noisy")
	results := make(chan result, 5)
	for range 5 {
		go func() { p, err := g.Acquire(context.Background(), "noisy"); results <- result{p, err} }()
	}
	eventually(t, "5 noisy requests wait", tenantWaitingIs(g, "noisy", 5))
	q, err := g.Acquire(context.Background(), "quiet")
	if err != nil {
		t.Fatalf("quiet blocked by noisy's queue: %v", err)
	}
	q.Release()
	// Each release serves the next noisy request in line.
	held.Release()
	for range 5 {
		r := recv(t, results)
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.p.Release()
	}
	assertDrained(t, g)
}

func TestBoundedQueue(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 10, Plans: map[string]pool.Plan{"std": {MaxConns: 1, MaxWaiting: 2}}})
	held := mustAcquire(t, g, "acme")
	w1 := acquireAsync(context.Background(), g, "acme")
	eventually(t, "first waiter queued", tenantWaitingIs(g, "acme", 1))
	w2 := acquireAsync(context.Background(), g, "acme")
	eventually(t, "second waiter queued", tenantWaitingIs(g, "acme", 2))
	_, err := g.Acquire(context.Background(), "acme")
	var ole *pool.OverLimitError
	if !errors.As(err, &ole) {
		t.Fatalf("third waiter: err = %v, want *OverLimitError", err)
	}
	// Two ahead of it with a cap of 1: the estimate covers three rounds of
	// the (unknown, one-second) hold time.
	if ole.RetryAfter != 3*time.Second {
		t.Fatalf("RetryAfter = %v, want 3s for two waiting ahead at cap 1 with no hold observed", ole.RetryAfter)
	}
	held.Release()
	r1 := recv(t, w1)
	if r1.err != nil {
		t.Fatal(r1.err)
	}
	assertPending(t, w2, g, "acme", 1) // FIFO: w2 still waits behind w1's permit
	r1.p.Release()
	r2 := recv(t, w2)
	if r2.err != nil {
		t.Fatal(r2.err)
	}
	r2.p.Release()
	if s, _ := g.TenantStat("acme"); s.Rejected != 1 || s.Acquired != 3 || s.WaitTime <= 0 {
		t.Fatalf("stats = %+v", s)
	}
	assertDrained(t, g)
}

func TestUnboundedQueueOnlyByName(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 1, Plans: map[string]pool.Plan{"batch": {MaxConns: 1, MaxWaiting: pool.Unbounded}}})
	held := mustAcquire(t, g, "job")
	ctx, cancel := context.WithCancel(context.Background())
	var chans []<-chan result
	for range 200 {
		chans = append(chans, acquireAsync(ctx, g, "job"))
	}
	eventually(t, "200 waiting", tenantWaitingIs(g, "job", 200))
	cancel()
	for _, ch := range chans {
		if r := recv(t, ch); !errors.Is(r.err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", r.err)
		}
	}
	held.Release()
	assertDrained(t, g)
}

func TestMaxWaitRejectsAfterWaiting(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 10, Plans: map[string]pool.Plan{"std": {MaxConns: 1, MaxWaiting: 5, MaxWait: 20 * time.Millisecond}}})
	held := mustAcquire(t, g, "acme")
	defer held.Release()
	_, err := g.Acquire(context.Background(), "acme")
	var ole *pool.OverLimitError
	if !errors.As(err, &ole) || !errors.Is(err, pool.ErrOverLimit) {
		t.Fatalf("err = %v, want *OverLimitError", err)
	}
	if ole.Waited < 20*time.Millisecond {
		t.Fatalf("Waited = %v, want at least MaxWait", ole.Waited)
	}
	if s, _ := g.TenantStat("acme"); s.TimedOut != 1 || s.Waiting != 0 || s.InUse != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestMaxWaitDoesNotBoundGlobalWait(t *testing.T) {
	// The request is within its tenant's cap and waits only for global
	// capacity: MaxWait must not reject it, only its context may.
	g := mustNew(t, pool.Config{Capacity: 1, Plans: map[string]pool.Plan{"std": {MaxConns: 1, MaxWaiting: 5, MaxWait: 5 * time.Millisecond}}})
	held := mustAcquire(t, g, "other")
	ch := acquireAsync(context.Background(), g, "acme")
	eventually(t, "acme waits", waitingIs(g, 1))
	time.Sleep(50 * time.Millisecond) // ten MaxWaits pass (time passing, not synchronisation)
	assertPending(t, ch, g, "acme", 1)
	held.Release()
	r := recv(t, ch)
	if r.err != nil {
		t.Fatalf("global wait rejected by MaxWait: %v", r.err)
	}
	r.p.Release()
}

func TestContextDeadlineWhileWaiting(t *testing.T) {
	for _, stage := range []string{"tenant cap", "global capacity"} {
		t.Run(stage, func(t *testing.T) {
			g := mustNew(t, pool.Config{Capacity: 1, Plans: map[string]pool.Plan{"std": {MaxConns: 1, MaxWaiting: 5}}})
			holder := "acme" // waits for its own cap
			if stage == "global capacity" {
				holder = "other"
			}
			held := mustAcquire(t, g, holder)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			defer cancel()
			_, err := g.Acquire(ctx, "acme")
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want DeadlineExceeded", err)
			}
			if errors.Is(err, pool.ErrOverLimit) {
				t.Fatalf("a deadline is not an over-limit rejection: %v", err)
			}
			if s, _ := g.TenantStat("acme"); s.TimedOut != 1 || s.Waiting != 0 {
				t.Fatalf("stats = %+v", s)
			}
			held.Release()
			assertDrained(t, g)
			mustAcquire(t, g, "acme").Release() // nothing leaked
		})
	}
}

func TestCancelledContextBeforeAcquire(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Acquire(ctx, "acme"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want Canceled", err)
	}
	assertDrained(t, g)
}

func TestInvalidTenantIDs(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 1, MaxTenantIDLen: 16})
	for name, id := range map[string]string{
		"empty":     "",
		"too long":  strings.Repeat("x", 17),
		"control":   "ac\x00me",
		"newline":   "acme\n",
		"bad utf-8": "ac\xffme",
	} {
		_, err := g.Acquire(context.Background(), id)
		if !errors.Is(err, pool.ErrInvalidTenant) {
			t.Errorf("%s: err = %v, want ErrInvalidTenant", name, err)
		}
	}
	if s := g.Stat(); s.Tenants != 0 || s.InUse != 0 {
		t.Fatalf("invalid IDs left state behind: %+v", s)
	}
	mustAcquire(t, g, "ünïcode-ok").Release()
}

func TestCloseFailsWaitersAndLaterAcquires(t *testing.T) {
	g, err := pool.New(pool.Config{Capacity: 1, Plans: map[string]pool.Plan{"p": {MaxConns: 1, MaxWaiting: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	held := mustAcquire(t, g, "a")
	capWaiter := acquireAsync(context.Background(), g, "a")    // over a's cap
	globalWaiter := acquireAsync(context.Background(), g, "b") // waits for capacity
	eventually(t, "two waiting", waitingIs(g, 2))
	g.Close()
	for _, ch := range []<-chan result{capWaiter, globalWaiter} {
		if r := recv(t, ch); !errors.Is(r.err, pool.ErrClosed) {
			t.Fatalf("waiter err = %v, want ErrClosed", r.err)
		}
	}
	if _, err := g.Acquire(context.Background(), "c"); !errors.Is(err, pool.ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	held.Release() // still safe
	assertDrained(t, g)
	g.Close() // idempotent
}

func TestRetryAfterFollowsHoldTimeAndQueue(t *testing.T) {
	// RetryAfter is derived from the tenant's observed hold time: a tenant
	// whose permits are held longer is told to come back later.
	measure := func(hold time.Duration) time.Duration {
		g := mustNew(t, pool.Config{Capacity: 10, Plans: map[string]pool.Plan{"p": {MaxConns: 1, MaxWaiting: 1}}})
		// Waited-for permits are always timed; make a few.
		blocker := mustAcquire(t, g, "x")
		for range 3 {
			ch := acquireAsync(context.Background(), g, "x")
			eventually(t, "queued", tenantWaitingIs(g, "x", 1))
			blocker.Release()
			r := recv(t, ch)
			time.Sleep(hold) // the work being done while holding
			blocker = r.p
		}
		ch := acquireAsync(context.Background(), g, "x")
		eventually(t, "queued", tenantWaitingIs(g, "x", 1))
		_, err := g.Acquire(context.Background(), "x")
		var ole *pool.OverLimitError
		if !errors.As(err, &ole) {
			t.Fatalf("err = %v", err)
		}
		blocker.Release()
		r := recv(t, ch)
		r.p.Release()
		return ole.RetryAfter
	}
	short, long := measure(2*time.Millisecond), measure(40*time.Millisecond)
	if long <= short {
		t.Fatalf("RetryAfter after 40ms holds (%v) not above after 2ms holds (%v)", long, short)
	}
}

func TestLookupErrorsAreSurfaced(t *testing.T) {
	lookupErr := errors.New("tenant directory down")
	g := mustNew(t, pool.Config{
		Capacity:    4,
		Plans:       map[string]pool.Plan{"std": {MaxConns: 2}, "ent": {MaxConns: 4}},
		DefaultPlan: "std",
		Lookup: func(ctx context.Context, id string) (pool.Tenant, error) {
			switch id {
			case "down":
				return pool.Tenant{}, lookupErr
			case "typo":
				return pool.Tenant{Plan: "entreprise"}, nil
			case "huge":
				return pool.Tenant{MaxConns: 5}, nil
			case "big":
				return pool.Tenant{Plan: "std", MaxConns: 3}, nil
			}
			return pool.Tenant{}, nil
		},
	})
	if _, err := g.Acquire(context.Background(), "down"); !errors.Is(err, lookupErr) {
		t.Fatalf("Lookup error not surfaced: %v", err)
	}
	if _, err := g.Acquire(context.Background(), "typo"); !errors.Is(err, pool.ErrUnknownPlan) || !strings.Contains(err.Error(), "entreprise") {
		t.Fatalf("unknown plan: %v", err)
	}
	if _, err := g.Acquire(context.Background(), "huge"); !errors.Is(err, pool.ErrInvalidConfig) {
		t.Fatalf("override above capacity: %v", err)
	}
	if s := g.Stat(); s.Tenants != 0 || s.InUse != 0 {
		t.Fatalf("failed lookups left state: %+v", s)
	}
	mustAcquire(t, g, "big")
	if s, _ := g.TenantStat("big"); s.Limit != 3 || s.Plan != "std" {
		t.Fatalf("override from Lookup not applied: %+v", s)
	}
	mustAcquire(t, g, "plain")
	if s, _ := g.TenantStat("plain"); s.Limit != 2 || s.Plan != "std" {
		t.Fatalf("default plan not applied: %+v", s)
	}
}

func TestRuntimeLimitChanges(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 10, Plans: map[string]pool.Plan{"std": {MaxConns: 2, MaxWaiting: 10}}})
	a, b := mustAcquire(t, g, "acme"), mustAcquire(t, g, "acme")
	w1 := acquireAsync(context.Background(), g, "acme")
	eventually(t, "waiting", tenantWaitingIs(g, "acme", 1))
	w2 := acquireAsync(context.Background(), g, "acme")
	eventually(t, "waiting", tenantWaitingIs(g, "acme", 2))

	// Raise: waiters are served at once.
	if err := g.SetTenantLimit("acme", 4); err != nil {
		t.Fatal(err)
	}
	r1, r2 := recv(t, w1), recv(t, w2)
	if r1.err != nil || r2.err != nil {
		t.Fatal(r1.err, r2.err)
	}
	// Cut below in use: nothing is revoked; new grants wait until below.
	if err := g.SetTenantLimit("acme", 1); err != nil {
		t.Fatal(err)
	}
	if s, _ := g.TenantStat("acme"); s.InUse != 4 || s.Limit != 1 {
		t.Fatalf("after cut: %+v", s)
	}
	w3 := acquireAsync(context.Background(), g, "acme")
	eventually(t, "waiting", tenantWaitingIs(g, "acme", 1))
	for _, p := range []pool.Permit{a, b, r1.p} {
		p.Release()
		assertPending(t, w3, g, "acme", 1) // still at or above the new cap of 1
	}
	r2.p.Release() // now 0 in use: w3 may go
	r3 := recv(t, w3)
	if r3.err != nil {
		t.Fatal(r3.err)
	}
	r3.p.Release()

	// A plan change applies to tracked tenants; clearing the override falls back to it.
	if err := g.SetPlan("std", pool.Plan{MaxConns: 3}); err != nil {
		t.Fatal(err)
	}
	if err := g.SetTenantLimit("acme", 0); err != nil {
		t.Fatal(err)
	}
	if s, _ := g.TenantStat("acme"); s.Limit != 3 {
		t.Fatalf("limit after plan change = %d, want 3", s.Limit)
	}
	if err := g.SetTenantLimit("acme", 11); !errors.Is(err, pool.ErrInvalidConfig) {
		t.Fatalf("limit above capacity: %v", err)
	}
	if err := g.SetPlan("std", pool.Plan{MaxConns: 11}); !errors.Is(err, pool.ErrInvalidConfig) {
		t.Fatalf("plan above capacity: %v", err)
	}
	assertDrained(t, g)
}

func TestCutDemotesRequestsWaitingForGlobalCapacity(t *testing.T) {
	// acme holds 1 of cap 3 and two more wait for global capacity (held by
	// other). Cutting acme to 1 must hand those two tenant slots back, so that
	// freeing global capacity does not take acme above its new cap.
	g := mustNew(t, pool.Config{Capacity: 2, Plans: map[string]pool.Plan{"p": {MaxConns: 2, MaxWaiting: 5}}})
	if err := g.SetTenantLimit("acme", 2); err != nil {
		t.Fatal(err)
	}
	a := mustAcquire(t, g, "acme")
	o := mustAcquire(t, g, "other")
	w := acquireAsync(context.Background(), g, "acme") // within cap, waits for capacity
	eventually(t, "waiting", tenantWaitingIs(g, "acme", 1))
	if err := g.SetTenantLimit("acme", 1); err != nil {
		t.Fatal(err)
	}
	o.Release() // global capacity frees, but acme is at its new cap
	assertPending(t, w, g, "acme", 1)
	if s, _ := g.TenantStat("acme"); s.InUse != 1 {
		t.Fatalf("acme InUse = %d above its cap of 1", s.InUse)
	}
	a.Release()
	r := recv(t, w)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.p.Release()
}

func TestRejectionAllocatesOnlyTheError(t *testing.T) {
	for _, maxWaiting := range []int{0, 1} {
		g := mustNew(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"p": {MaxConns: 1, MaxWaiting: maxWaiting}}})
		held := mustAcquire(t, g, "acme")
		ctx, cancel := context.WithCancel(context.Background())
		var queued <-chan result
		if maxWaiting == 1 {
			queued = acquireAsync(ctx, g, "acme")
			eventually(t, "one request queued", waitingIs(g, 1))
		}
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := g.Acquire(context.Background(), "acme"); !errors.Is(err, pool.ErrOverLimit) {
				t.Fatalf("err = %v, want a rejection", err)
			}
		})
		if allocs > 1 {
			t.Errorf("MaxWaiting %d: a rejection allocates %.0f times, want at most 1 (the error)", maxWaiting, allocs)
		}
		cancel()
		if queued != nil {
			recv(t, queued)
		}
		held.Release()
		assertDrained(t, g)
	}
}

// TestWaitingCountsEachTenantsQueuedRequests checks Gate.Waiting against the
// requests queued at the tenant's cap and at the global capacity, per tenant,
// and against TenantStat's count.
func TestWaitingCountsEachTenantsQueuedRequests(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 2, Plans: map[string]pool.Plan{"p": {MaxConns: 1, MaxWaiting: pool.Unbounded}}})
	if n := g.Waiting("acme"); n != 0 {
		t.Fatalf("Waiting of a tenant never seen = %d, want 0", n)
	}
	a := mustAcquire(t, g, "acme")
	b := mustAcquire(t, g, "beta")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	atCap := []<-chan result{acquireAsync(ctx, g, "acme"), acquireAsync(ctx, g, "acme")}
	atCapacity := acquireAsync(ctx, g, "gamma") // gamma is under its cap; the capacity is all taken
	eventually(t, "three requests queued", func() bool { return g.Stat().Waiting == 3 })
	for tenant, want := range map[string]int{"acme": 2, "beta": 0, "gamma": 1} {
		s, _ := g.TenantStat(tenant)
		if n := g.Waiting(tenant); n != want || n != s.Waiting {
			t.Errorf("Waiting(%q) = %d, want %d (TenantStat says %d)", tenant, n, want, s.Waiting)
		}
	}
	b.Release() // gamma takes beta's unit
	if r := <-atCapacity; r.err != nil {
		t.Fatalf("gamma: %v", r.err)
	} else {
		defer r.p.Release()
	}
	a.Release() // acme's first waiter takes its slot
	var other <-chan result
	select {
	case r := <-atCap[0]:
		if r.err != nil {
			t.Fatalf("acme's first waiter: %v", r.err)
		}
		defer r.p.Release()
		other = atCap[1]
	case r := <-atCap[1]:
		if r.err != nil {
			t.Fatalf("acme's first waiter: %v", r.err)
		}
		defer r.p.Release()
		other = atCap[0]
	}
	if n, m := g.Waiting("acme"), g.Waiting("gamma"); n != 1 || m != 0 {
		t.Errorf("after two grants Waiting(acme), Waiting(gamma) = %d, %d, want 1, 0", n, m)
	}
	cancel()
	if r := <-other; r.err == nil {
		r.p.Release()
		t.Fatal("acme's second waiter was granted after its cancellation, with acme's slot held")
	}
	if n := g.Waiting("acme"); n != 0 {
		t.Errorf("Waiting(acme) = %d after its waiter was cancelled, want 0", n)
	}
}
