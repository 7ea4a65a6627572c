package pool_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

// TestAffinityBoundsOvertaking: with one unit of capacity, tenant a holding
// it with twenty more requests queued and b with one, each release of a's
// permit goes to a's next request Affinity times in a row, and then to b,
// whose turn it was: b is overtaken exactly Affinity times, and without
// Affinity (negative, or the default without Database) not at all.
func TestAffinityBoundsOvertaking(t *testing.T) {
	for _, tc := range []struct {
		name     string
		affinity int
		want     int // a's grants by affinity before b's
	}{
		{"off", -1, 0},
		{"default without Database", 0, 0},
		{"one", 1, 1},
		{"three", 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := mustNew(t, pool.Config{
				Capacity: 1,
				Affinity: tc.affinity,
				Plans:    map[string]pool.Plan{"p": {MaxConns: 1, MaxWaiting: pool.Unbounded}},
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			held := mustAcquire(t, g, "a")
			var as []<-chan result
			for i := range 20 {
				as = append(as, acquireAsync(ctx, g, "a"))
				eventually(t, "a's requests queue", tenantWaitingIs(g, "a", i+1))
			}
			b := acquireAsync(ctx, g, "b")
			eventually(t, "b's request queues", tenantWaitingIs(g, "b", 1))

			got := 0
			for {
				held.Release()
				if s, _ := g.TenantStat("b"); s.InUse == 1 {
					break
				}
				got++
				if got > len(as) {
					t.Fatalf("b not served after %d releases of a's permits", got)
				}
				held = recv(t, as[got-1]).p // granted in order
				if held == (pool.Permit{}) {
					t.Fatalf("a's request %d got no permit", got)
				}
			}
			if got != tc.want {
				t.Errorf("b was overtaken by %d of a's requests, want %d", got, tc.want)
			}
			recv(t, b).p.Release() // and a's next request follows
			if s, _ := g.TenantStat("a"); s.InUse != 1 {
				t.Fatalf("a holds %d after b's release, want 1", s.InUse)
			}
			cancel()
			for _, ch := range as[got:] {
				if r := recv(t, ch); r.err == nil {
					r.p.Release()
				}
			}
			assertDrained(t, g)
		})
	}
}

// TestAffinityPassesNoReservation: a tenant waiting below its reservation
// is served before the releasing tenant's own next request.
func TestAffinityPassesNoReservation(t *testing.T) {
	g := mustNew(t, pool.Config{
		Capacity:    2,
		Affinity:    8,
		MaxReserved: 1,
		Plans: map[string]pool.Plan{
			"p":   {MaxConns: 2, MaxWaiting: pool.Unbounded},
			"res": {MaxConns: 1, MaxWaiting: pool.Unbounded, ReservedConns: 1},
		},
		DefaultPlan: "p",
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			if id == "r" {
				return pool.Tenant{Plan: "res"}, nil
			}
			return pool.Tenant{}, nil
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a1, a2 := mustAcquire(t, g, "a"), mustAcquire(t, g, "a") // before r's reservation is in force
	aw := acquireAsync(ctx, g, "a")
	eventually(t, "a's request queues", tenantWaitingIs(g, "a", 1))
	rw := acquireAsync(ctx, g, "r")
	eventually(t, "r's request queues", tenantWaitingIs(g, "r", 1))
	a1.Release()
	if s, _ := g.TenantStat("r"); s.InUse != 1 {
		t.Fatalf("r holds %d after a's release, want 1: affinity passed its reservation", s.InUse)
	}
	recv(t, rw).p.Release()
	a2.Release()
	recv(t, aw).p.Release()
	assertDrained(t, g)
}

// TestAffinityKeepsShares: a tenant with four requests at a time beside
// three with one each, on one unit of capacity. Affinity hands each of the
// busy tenant's releases to its own next request, up to 8 in a row, but
// each such grant is paid back with one of its turns: its share of the
// grants stays near the fair quarter (0.32 here; at most a half), where
// grants by affinity that nothing paid back gave it three quarters.
func TestAffinityKeepsShares(t *testing.T) {
	g := mustNew(t, pool.Config{
		Capacity: 1,
		Affinity: 8,
		Plans:    map[string]pool.Plan{"p": {MaxConns: 1, MaxWaiting: pool.Unbounded}},
	})
	ids := []string{"many", "o1", "o2", "o3"}
	workers := []int{4, 1, 1, 1}
	grants := make([]atomic.Int64, len(ids))
	var all atomic.Int64
	const total = 4000
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, id := range ids {
		for range workers[i] {
			wg.Go(func() {
				<-start
				for all.Load() < total {
					p, err := g.Acquire(context.Background(), id)
					if err != nil {
						t.Errorf("tenant %s: %v", id, err)
						return
					}
					grants[i].Add(1)
					all.Add(1)
					time.Sleep(20 * time.Microsecond) // hold it, so that the gate stays saturated
					p.Release()
				}
			})
		}
	}
	close(start)
	wg.Wait()
	var sum int64
	got := make([]int64, len(ids))
	for i := range grants {
		got[i] = grants[i].Load()
		sum += got[i]
	}
	share := float64(got[0]) / float64(sum)
	t.Logf("the busy tenant got %.2f of the grants (%v)", share, got)
	if share > 0.5 {
		t.Errorf("the busy tenant got %.2f of the grants (%v), want at most 0.5 (fair: 0.25)", share, got)
	}
	assertDrained(t, g)
}
