package pool_test

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

func TestWeightedFairShares(t *testing.T) {
	// Three tenants with weights 1, 1 and 2 keep a saturated gate busy; the
	// fair gate must split grants 1:1:2 (within 10%), whatever the number of
	// requests each has in flight.
	g := mustNew(t, pool.Config{
		Capacity: 2,
		Plans: map[string]pool.Plan{
			"w1": {MaxConns: 2, MaxWaiting: pool.Unbounded, Weight: 1},
			"w2": {MaxConns: 2, MaxWaiting: pool.Unbounded, Weight: 2},
		},
		DefaultPlan: "w1",
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			if id == "c" {
				return pool.Tenant{Plan: "w2"}, nil
			}
			return pool.Tenant{}, nil
		},
	})
	// More workers than the cap, so each tenant always has requests waiting.
	grants := saturate(t, g, []string{"a", "b", "c"}, 5, 4000)
	sum := float64(grants[0] + grants[1] + grants[2])
	for i, want := range []float64{0.25, 0.25, 0.5} {
		got := float64(grants[i]) / sum
		if math.Abs(got-want)/want > 0.10 {
			t.Errorf("tenant %d got %.3f of grants, want %.3f ±10%% (grants %v)", i, got, want, grants)
		}
	}
	assertDrained(t, g)
}

// TestWeightsHoldWhateverTheCaps: a tenant whose own cap lets only one of its
// requests at a time wait for global capacity still gets its weight's share.
func TestWeightsHoldWhateverTheCaps(t *testing.T) {
	g := mustNew(t, pool.Config{
		Capacity: 1,
		Plans: map[string]pool.Plan{
			"heavy": {MaxConns: 1, MaxWaiting: pool.Unbounded, Weight: 3},
			"light": {MaxConns: 1, MaxWaiting: pool.Unbounded, Weight: 1},
		},
		DefaultPlan: "light",
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			return pool.Tenant{Plan: id}, nil
		},
	})
	grants := saturate(t, g, []string{"heavy", "light"}, 3, 2000) // both stay backlogged behind their caps of 1
	ratio := float64(grants[0]) / float64(grants[1])
	if math.Abs(ratio-3)/3 > 0.10 {
		t.Errorf("heavy:light = %.2f (%d:%d), want 3 ±10%%", ratio, grants[0], grants[1])
	}
	assertDrained(t, g)
}

// TestOneWaiterNotStarvedByAThousand: big has a thousand requests queued, eight
// of them already holding big's slots and waiting for global capacity ahead of
// small's one. Served per tenant in turn, small gets one of the next two
// grants; served first come, first served it would wait for big's eight.
func TestOneWaiterNotStarvedByAThousand(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 8, Plans: map[string]pool.Plan{"p": {MaxConns: 8, MaxWaiting: pool.Unbounded}}})
	var held []pool.Permit
	for range 8 {
		held = append(held, mustAcquire(t, g, "holder"))
	}
	ctx, cancel := context.WithCancel(context.Background())
	granted := make(chan pool.Permit, 1001)
	var wg sync.WaitGroup
	for range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p, err := g.Acquire(ctx, "big"); err == nil {
				granted <- p
			}
		}()
	}
	eventually(t, "1000 big requests wait", tenantWaitingIs(g, "big", 1000))
	small := acquireAsync(context.Background(), g, "small")
	eventually(t, "small waits", tenantWaitingIs(g, "small", 1))

	for i := range 2 { // free one unit at a time
		held[i].Release()
		// Grants are counted under the lock at once: the stats tell who got it.
		if s, _ := g.TenantStat("small"); s.InUse == 1 {
			break
		}
	}
	if s, _ := g.TenantStat("small"); s.InUse != 1 {
		t.Fatal("small not served within two grants while big had 8 requests ahead of it")
	}
	r := recv(t, small)
	if r.err != nil {
		t.Fatal(r.err)
	}
	smallPermit := r.p
	cancel()
	wg.Wait()
	close(granted)
	for p := range granted {
		p.Release()
	}
	for _, p := range held[2:] {
		p.Release()
	}
	smallPermit.Release()
	assertDrained(t, g)
}

func reservationGate(t *testing.T) *pool.Gate {
	return mustNew(t, pool.Config{
		Capacity:    4,
		MaxReserved: 2,
		Plans: map[string]pool.Plan{
			"ent": {MaxConns: 4, ReservedConns: 2, MaxWaiting: 4},
			"std": {MaxConns: 4, MaxWaiting: 4},
		},
		DefaultPlan: "std",
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			if id[:3] == "ent" {
				return pool.Tenant{Plan: "ent"}, nil
			}
			return pool.Tenant{}, nil
		},
	})
}

func TestReservationKeepsCapacityForItsTenant(t *testing.T) {
	g := reservationGate(t)
	mustAcquire(t, g, "ent").Release() // ent is tracked: its reservation of 2 is in force
	if s := g.Stat(); s.Reserved != 2 {
		t.Fatalf("Reserved = %d, want 2", s.Reserved)
	}
	// std may take the unreserved half only, though its own cap is 4.
	s1, s2 := mustAcquire(t, g, "std"), mustAcquire(t, g, "std")
	third := acquireAsync(context.Background(), g, "std")
	eventually(t, "std's third request waits", tenantWaitingIs(g, "std", 1))

	// ent gets its two reserved units without anyone releasing anything.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e1, err := g.Acquire(ctx, "ent")
	if err != nil {
		t.Fatalf("ent waited for its reservation: %v", err)
	}
	e2, err := g.Acquire(ctx, "ent")
	if err != nil {
		t.Fatalf("ent waited for its reservation: %v", err)
	}
	if s, _ := g.TenantStat("ent"); s.InUse != 2 || s.Reserved != 2 || s.WaitTime != 0 {
		t.Fatalf("ent = %+v", s)
	}
	// Above its reservation, ent competes like anyone else.
	e3 := acquireAsync(context.Background(), g, "ent")
	eventually(t, "ent's third waits", tenantWaitingIs(g, "ent", 1))
	s1.Release()
	s2.Release()
	for _, ch := range []<-chan result{third, e3} {
		r := recv(t, ch)
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.p.Release()
	}
	e1.Release()
	e2.Release()
	assertDrained(t, g)
}

func TestReservedTenantServedBeforeRing(t *testing.T) {
	g := reservationGate(t)
	mustAcquire(t, g, "ent").Release()
	// Fill the gate: std takes its two, ent goes above its reservation.
	var held []pool.Permit
	for _, id := range []string{"std", "std", "ent", "ent"} {
		held = append(held, mustAcquire(t, g, id))
	}
	stdWaiter := acquireAsync(context.Background(), g, "std")
	eventually(t, "std waits", tenantWaitingIs(g, "std", 1))
	// ent drops below its reservation; its next request must come first.
	held[2].Release()
	held[3].Release()
	// The two freed units are reserved for ent: std cannot have them.
	assertPending(t, stdWaiter, g, "std", 1)
	e := mustAcquire(t, g, "ent")
	assertPending(t, stdWaiter, g, "std", 1)
	e.Release()
	held[0].Release()
	r := recv(t, stdWaiter)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.p.Release()
	held[1].Release()
	assertDrained(t, g)
}

func TestReservationsInForceNeverExceedMaxReserved(t *testing.T) {
	g := reservationGate(t)
	mustAcquire(t, g, "ent-1").Release()
	mustAcquire(t, g, "ent-2").Release() // would bring reservations to 4 > MaxReserved 2
	s := g.Stat()
	if s.Reserved != 2 || s.ReservationsDenied != 1 {
		t.Fatalf("Stat = %+v, want Reserved 2 and 1 denied", s)
	}
	if e2, _ := g.TenantStat("ent-2"); e2.Reserved != 0 {
		t.Fatalf("ent-2 = %+v, want no reservation", e2)
	}
	// A denied tenant still works, sharing the unreserved capacity.
	mustAcquire(t, g, "ent-2").Release()
}

// saturate keeps g busy with workers goroutines per tenant, each acquiring,
// holding briefly and releasing, until total grants were made; it returns the
// grants each tenant got, in the order of ids.
func saturate(t *testing.T, g *pool.Gate, ids []string, workers, total int64) []int64 {
	t.Helper()
	grants := make([]atomic.Int64, len(ids))
	var all atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, id := range ids {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for all.Load() < total {
					p, err := g.Acquire(ctx, id)
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("tenant %s: %v", id, err)
						}
						return
					}
					grants[i].Add(1)
					all.Add(1)
					time.Sleep(20 * time.Microsecond) // hold it, so that the gate stays saturated
					p.Release()
				}
				cancel()
			}()
		}
	}
	close(start)
	wg.Wait()
	out := make([]int64, len(ids))
	for i := range grants {
		out[i] = grants[i].Load()
	}
	return out
}
