package pool

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestStressInvariants drives a gate with many tenants, random holds,
// cancellations, deadlines, double releases and runtime limit changes, and
// checks at every grant that no tenant goes above its cap and the total stays
// within capacity. At the end nothing may be in use or waiting.
//
// The cluster variants put a ClusterLimiter stage in front of global capacity;
// in the slow one each cluster answer takes up to half a millisecond, so that
// limits change while many requests are between their tenant slot and the
// cluster's answer (the interleaving that once granted above a lowered cap).
func TestStressInvariants(t *testing.T) {
	t.Run("local", func(t *testing.T) { stress(t, nil, false) })
	t.Run("cluster", func(t *testing.T) { stress(t, newMemCluster(), false) })
	t.Run("slow-cluster", func(t *testing.T) {
		mc := newMemCluster()
		mc.delay = 500 * time.Microsecond
		stress(t, mc, false)
	})
	t.Run("adaptive", func(t *testing.T) { stress(t, nil, true) })
	t.Run("adaptive-cluster", func(t *testing.T) { stress(t, newMemCluster(), true) })
}

// stress runs the workload; with adaptive, effective limits move all the
// time too: the slack for jitter is off, the tolerance minimal and probes
// every millisecond, so cuts, rises and probes race everything else.
func stress(t *testing.T, mc *memCluster, adaptive bool) {
	var violations, cutSeen, raisedSeen atomic.Int64
	grantHook = func(g *Gate, tn *tenant) {
		if tn.limit < tn.cap {
			cutSeen.Add(1)
		}
		if tn.ad != nil && tn.limit > g.adaptiveFloorLocked(tn) {
			raisedSeen.Add(1)
		}
		if tn.inUse >= tn.limit || g.used >= g.cfg.Capacity {
			if violations.Add(1) <= 5 {
				t.Errorf("grant to %s with %d in use of %d, gate %d of %d", tn.id, tn.inUse, tn.limit, g.used, g.cfg.Capacity)
			}
		}
	}
	defer func() { grantHook = nil }()
	if adaptive {
		slack := inflationSlack
		inflationSlack = 0
		defer func() { inflationSlack = slack }()
	}

	const capacity, tenants, workers = 8, 24, 48
	g, err := New(Config{
		Capacity:    capacity,
		MaxReserved: 4,
		Plans: map[string]Plan{
			"free": {MaxConns: 2},
			"std":  {MaxConns: 4, MaxWaiting: 3, MaxWait: 2 * time.Millisecond},
			"ent":  {MaxConns: 6, MaxWaiting: Unbounded, Weight: 3, ReservedConns: 2},
		},
		DefaultPlan: "std",
		MaxTenants:  16, // fewer than tenants: eviction and refusals happen too
		IdleTTL:     time.Millisecond,
		Lookup: func(_ context.Context, id string) (Tenant, error) {
			switch id[len(id)-1] % 3 {
			case 0:
				return Tenant{Plan: "free"}, nil
			case 1:
				return Tenant{Plan: "ent"}, nil
			}
			return Tenant{}, nil
		},
		LookupTTL: time.Millisecond,
		Adaptive:  Adaptive{Enabled: adaptive, MinConns: 1, Tolerance: minAdaptiveTolerance, ProbeInterval: time.Millisecond},
	})
	if mc != nil {
		g.cfg.Cluster = mc
	}
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	ctx, stop := context.WithTimeout(context.Background(), 2*time.Second)
	defer stop()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for ctx.Err() == nil {
				id := fmt.Sprintf("tenant-%d", rng.IntN(tenants))
				actx, cancel := context.WithCancel(ctx)
				switch rng.IntN(4) {
				case 0:
					actx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(500))*time.Microsecond)
				case 1:
					d := time.Duration(rng.IntN(300)) * time.Microsecond
					go func() { time.Sleep(d); cancel() }()
				}
				p, err := g.Acquire(actx, id)
				if err == nil {
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
					p.Release()
					if rng.IntN(4) == 0 {
						p.Release()
					}
				}
				cancel()
			}
		}()
	}
	wg.Add(1)
	go func() { // runtime changes
		defer wg.Done()
		rng := rand.New(rand.NewPCG(99, 2))
		for ctx.Err() == nil {
			id := fmt.Sprintf("tenant-%d", rng.IntN(tenants))
			if err := g.SetTenantLimit(id, rng.IntN(capacity+1)); err != nil {
				t.Error(err)
			}
			if err := g.SetPlan("std", Plan{MaxConns: 1 + rng.IntN(capacity), MaxWaiting: rng.IntN(4), MaxWait: time.Millisecond}); err != nil {
				t.Error(err)
			}
			g.InvalidateTenant(id)
			g.EvictIdle()
			time.Sleep(200 * time.Microsecond)
		}
	}()
	wg.Wait()

	s := g.Stat()
	if s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("after the run: %d in use, %d waiting", s.InUse, s.Waiting)
	}
	g.mu.Lock()
	if g.reservedFree != g.reservedTotal || g.ring.cursor != nil || g.reserved.head != nil {
		t.Errorf("bookkeeping off: reservedFree %d reservedTotal %d ring %v line %v",
			g.reservedFree, g.reservedTotal, g.ring.cursor != nil, g.reserved.head != nil)
	}
	g.mu.Unlock()
	if mc != nil {
		if n := mc.outstanding(); n != 0 {
			t.Errorf("%d cluster leases outstanding", n)
		}
		mc.mu.Lock()
		for tenant, n := range mc.max {
			if n > capacity {
				t.Errorf("%s held %d cluster slots at once", tenant, n)
			}
		}
		mc.mu.Unlock()
	}
	if adaptive && (cutSeen.Load() == 0 || raisedSeen.Load() == 0) {
		t.Errorf("adaptive limits did not move both ways: %d grants under a cut limit, %d above the floor",
			cutSeen.Load(), raisedSeen.Load())
	}
	if s.Acquired == 0 || s.Rejected == 0 || s.TimedOut == 0 || s.Cancelled == 0 || s.Evicted == 0 {
		t.Errorf("the run did not reach every path: %+v", s)
	}
	t.Logf("%+v", s)
}
