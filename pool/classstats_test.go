package pool_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

// TestTenantClassesAddUp checks that a tenant's per-class stats sum to the
// tenant's under a mixed load: tenants that only ever use the default class
// and never wait (they must still list it), tenants that use the default
// class first and a class later, and tenants whose classes queue, time out,
// are rejected and are cancelled.
func TestTenantClassesAddUp(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 6,
		Plans:      map[string]pool.Plan{"p": {MaxConns: 3, MaxWaiting: 2, MaxWait: time.Millisecond}},
		MaxTenants: 100,
		IdleTTL:    time.Hour,
		Classes: map[string]pool.Class{
			"batch":  {MaxConns: 2, MaxWaiting: 2, MaxWait: time.Millisecond, MaxShare: 0.5},
			"report": {MaxConns: 1, MaxWaiting: pool.Unbounded, MaxShare: 0.5},
		}})

	// A tenant that only ever uses the default class, uncontended.
	for range 5 {
		mustAcquire(t, g, "quiet").Release()
	}
	// A tenant that holds a default-class permit before its first class,
	// and releases it after.
	early := mustAcquire(t, g, "late-class")
	mustAcquireCtx(t, g, batch, "late-class").Release()
	early.Release()

	ctx, stop := context.WithTimeout(context.Background(), time.Second)
	defer stop()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for ctx.Err() == nil {
				id := fmt.Sprintf("mixed-%d", rng.IntN(4))
				actx, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(2000))*time.Microsecond)
				switch rng.IntN(4) {
				case 0:
					actx = pool.WithClass(actx, "batch")
				case 1:
					actx = pool.WithClass(actx, "report")
				}
				if rng.IntN(8) == 0 {
					id = fmt.Sprintf("default-only-%d", rng.IntN(3))
					actx = pool.WithClass(actx, pool.DefaultClass)
				}
				if p, err := g.Acquire(actx, id); err == nil {
					time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
					p.Release()
				}
				cancel()
			}
		}()
	}
	wg.Wait()

	stats := g.AppendTenantStat(nil)
	if len(stats) < 3 {
		t.Fatalf("only %d tenants tracked", len(stats))
	}
	var contended int
	for _, s := range stats {
		if len(s.Classes) != 3 || s.Classes[0].Class != pool.DefaultClass {
			t.Errorf("%s: Classes = %+v, want the default class and two others", s.Tenant, s.Classes)
			continue
		}
		var sum pool.ClassStat
		for _, c := range s.Classes {
			sum.Acquired += c.Acquired
			sum.Rejected += c.Rejected
			sum.TimedOut += c.TimedOut
			sum.Cancelled += c.Cancelled
			sum.WaitTime += c.WaitTime
			sum.HoldTime += c.HoldTime
			sum.InUse += c.InUse
			sum.Waiting += c.Waiting
		}
		want := pool.ClassStat{Acquired: s.Acquired, Rejected: s.Rejected, TimedOut: s.TimedOut,
			Cancelled: s.Cancelled, WaitTime: s.WaitTime, HoldTime: s.HoldTime, InUse: s.InUse, Waiting: s.Waiting}
		if sum != want {
			t.Errorf("%s: classes sum to %+v, the tenant has %+v", s.Tenant, sum, want)
		}
		if s.Rejected+s.TimedOut+s.Cancelled > 0 {
			contended++
		}
	}
	if contended == 0 {
		t.Error("no tenant was ever refused: the load did not reach the contended paths")
	}
	if s, _ := g.TenantStat("quiet"); len(s.Classes) == 0 || s.Classes[0].Acquired != 5 {
		t.Errorf("quiet: %+v, want 5 default-class acquisitions", s.Classes)
	}
	if s, _ := g.TenantStat("late-class"); len(s.Classes) < 2 || s.Classes[0].Acquired != 1 || s.Classes[1].Acquired != 1 {
		t.Errorf("late-class: %+v, want one default and one batch acquisition", s.Classes)
	}
}
