package pool

import (
	"context"
	"errors"
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
	t.Run("local", func(t *testing.T) { stress(t, nil, false, false, false) })
	t.Run("cluster", func(t *testing.T) { stress(t, newMemCluster(), false, false, false) })
	t.Run("slow-cluster", func(t *testing.T) {
		mc := newMemCluster()
		mc.delay = 500 * time.Microsecond
		stress(t, mc, false, false, false)
	})
	t.Run("adaptive", func(t *testing.T) { stress(t, nil, true, false, false) })
	t.Run("adaptive-cluster", func(t *testing.T) { stress(t, newMemCluster(), true, false, false) })
	t.Run("classes", func(t *testing.T) { stress(t, nil, false, true, false) })
	t.Run("classes-adaptive-cluster", func(t *testing.T) { stress(t, newMemCluster(), true, true, false) })
	t.Run("servers", func(t *testing.T) { stress(t, nil, false, false, true) })
	t.Run("servers-classes-cluster", func(t *testing.T) { stress(t, newMemCluster(), false, true, true) })
	t.Run("affinity-servers-classes-cluster", func(t *testing.T) {
		stressAffinity = 3
		defer func() { stressAffinity = 0 }()
		stress(t, newMemCluster(), false, true, true)
	})
	t.Run("affinity-adaptive", func(t *testing.T) {
		stressAffinity = 3
		defer func() { stressAffinity = 0 }()
		stress(t, nil, true, false, false)
	})
}

// stressAffinity is the Config.Affinity of stress's gate.
var stressAffinity int

// stress runs the workload; with adaptive, effective limits move all the
// time too: the slack for jitter is off, the tolerance minimal and probes
// every millisecond, so cuts, rises and probes race everything else. With
// classes, requests are of two classes besides the default one (and now
// and then of an unknown one), whose caps inside the tenants and shares of
// the capacity are checked at every grant as well.
//
// With servers, the capacity is split over two servers, the placement of
// every tenant flips between them all the time (taken once it holds
// nothing), and tenants are drained and resumed, on either server or where
// they were, at random.
func stress(t *testing.T, mc *memCluster, adaptive, classes, servers bool) {
	var violations, cutSeen, raisedSeen atomic.Int64
	grantHook = func(g *Gate, tn *tenant, c *classState) {
		if tn.limit < tn.cap {
			cutSeen.Add(1)
		}
		if tn.ad != nil && tn.limit > g.adaptiveFloorLocked(tn) {
			raisedSeen.Add(1)
		}
		if v := grantViolation(g, tn, c); v != "" {
			if violations.Add(1) <= 5 {
				t.Errorf("grant beyond a limit: %s", v)
			}
		}
	}
	defer func() { grantHook = nil }()
	if adaptive {
		slack := inflationSlack
		inflationSlack = 0
		defer func() { inflationSlack = slack }()
	}

	const tenants, workers = 24, 48
	capacity, totalCapacity := 8, 8
	var flip atomic.Int64 // with servers: bumped to move tenants between them
	var srvs map[string]int
	var place func(context.Context, string) (Placement, error)
	if servers {
		capacity, totalCapacity, srvs = 6, 14, map[string]int{"a": 8, "b": 6}
		place = func(_ context.Context, id string) (Placement, error) {
			if (int64(len(id))+int64(id[len(id)-1])+flip.Load())%2 == 0 {
				return Placement{Server: "a"}, nil
			}
			return Placement{Server: "b"}, nil
		}
	}
	g, err := New(Config{
		Capacity:    totalCapacity,
		Servers:     srvs,
		Placement:   place,
		MaxReserved: 4,
		Affinity:    stressAffinity,
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
		Classes:   classesIf(classes),
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
				if classes {
					switch rng.IntN(7) {
					case 0, 1, 2:
						actx = WithClass(actx, "batch")
					case 3:
						actx = WithClass(actx, "report")
					case 4:
						actx = WithClass(actx, "nope")
					}
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
			p := Plan{MaxConns: 1 + rng.IntN(capacity), MaxWaiting: rng.IntN(4), MaxWait: time.Millisecond}
			if classes {
				p.ClassConns = map[string]int{"batch": 1 + rng.IntN(p.MaxConns), "report": 1}
			}
			if err := g.SetPlan("std", p); err != nil {
				t.Error(err)
			}
			g.InvalidateTenant(id)
			g.EvictIdle()
			if servers {
				flip.Add(int64(rng.IntN(2)))
				if d, err := g.Drain(ctx, fmt.Sprintf("tenant-%d", rng.IntN(tenants))); err == nil {
					time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
					var at *Placement
					switch rng.IntN(3) {
					case 0:
						at = &Placement{Server: "a"}
					case 1:
						at = &Placement{Server: "b"}
					}
					_ = d.Resume(at) // an error when not drained: it resumes where it was
				} else if !errors.Is(err, ErrMoving) && ctx.Err() == nil && !errors.Is(err, ErrTooManyTenants) {
					t.Error(err)
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	wg.Wait()

	s := g.Stat()
	if s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("after the run: %d in use, %d waiting", s.InUse, s.Waiting)
	}
	g.mu.Lock()
	for _, c := range g.classes {
		if c.used != 0 || c.waiting != 0 {
			t.Errorf("class %s bookkeeping off: %d used, %d waiting", c.name, c.used, c.waiting)
		}
	}
	for _, s := range g.serverList {
		for i, c := range s.classes {
			if c.used != 0 || c.ring.cursor != nil || c.reserved.head != nil {
				t.Errorf("server %q class %d bookkeeping off: %d used, ring %v, line %v",
					s.name, i, c.used, c.ring.cursor != nil, c.reserved.head != nil)
			}
		}
		if s.used != 0 || s.reservedFree != s.reservedTotal {
			t.Errorf("server %q bookkeeping off: %d used, reservedFree %d reservedTotal %d", s.name, s.used, s.reservedFree, s.reservedTotal)
		}
	}
	for id, tn := range g.tenants {
		if tn.ad != nil && len(tn.ad.out) != 0 {
			t.Errorf("%s holds nothing, but its controller keeps %d grant clocks", id, len(tn.ad.out))
		}
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
	for _, c := range s.Classes {
		if c.Acquired == 0 || c.Rejected+c.TimedOut == 0 || c.InUse != 0 || c.Waiting != 0 {
			t.Errorf("class %s: %+v", c.Class, c)
		}
	}
	t.Logf("%+v", s)
}

// classesIf returns the stress test's classes when on is set, else nil.
func classesIf(on bool) map[string]Class {
	if !on {
		return nil
	}
	return map[string]Class{
		"batch":  {MaxConns: 2, MaxWaiting: 3, MaxWait: time.Millisecond, MaxShare: 0.5},
		"report": {MaxConns: 1, MaxWaiting: Unbounded, MaxShare: 0.25, MinShare: 0.25},
	}
}
