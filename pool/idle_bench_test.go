package pool

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkIdleTenantMemory reports the heap each tracked idle tenant costs at
// 100,000 tenants, and what is left of it after they are evicted.
func BenchmarkIdleTenantMemory(b *testing.B) {
	const n = 100_000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("tenant-%06d", i)
	}
	ctx := context.Background()
	for b.Loop() {
		g, err := New(Config{Capacity: 10, MaxTenants: n, IdleTTL: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		var clock int64 = 1
		g.clock = func() int64 { return clock }
		before := heapAlloc()
		for _, id := range ids {
			p, err := g.Acquire(ctx, id)
			if err != nil {
				b.Fatal(err)
			}
			p.Release()
		}
		tracked := heapAlloc()
		if got := g.Stat().Tenants; got != n {
			b.Fatalf("tracked %d tenants, want %d", got, n)
		}
		g.EvictIdle() // stamps every idle tenant
		clock += int64(2 * time.Hour)
		g.EvictIdle() // evicts them
		if got := g.Stat().Tenants; got != 0 {
			b.Fatalf("%d tenants left after eviction", got)
		}
		after := heapAlloc()
		b.ReportMetric(float64(tracked-before)/n, "B/idle-tenant")
		b.ReportMetric(float64(after-before)/n, "B/tenant-after-evict")
		runtime.KeepAlive(g)
		runtime.KeepAlive(ids)
	}
}

func heapAlloc() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// BenchmarkAdminAt100kTenants runs each administrative operation over 100,000
// tracked tenants while one goroutine keeps acquiring and releasing for
// another tenant, and reports the longest that admission took: with the work
// done adminBatch tenants per hold of the lock, it stays near one batch's
// time instead of the whole operation's.
func BenchmarkAdminAt100kTenants(b *testing.B) {
	const n = 100_000
	ops := map[string]func(g *Gate){
		"SetPlan":          func(g *Gate) { _ = g.SetPlan("p", Plan{MaxConns: 1 + len(g.tenants)%2}) },
		"AppendTenantStat": func(g *Gate) { _ = g.AppendTenantStat(nil) },
	}
	for _, name := range []string{"SetPlan", "AppendTenantStat"} {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			g, err := New(Config{Capacity: 10, MaxTenants: n + 1, IdleTTL: time.Hour, Plans: map[string]Plan{"p": {MaxConns: 2}}})
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			for i := range n {
				p, _ := g.Acquire(ctx, fmt.Sprintf("tenant-%06d", i))
				p.Release()
			}
			var worst time.Duration
			stop, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					p, _ := g.Acquire(ctx, "probe")
					p.Release()
					worst = max(worst, time.Since(start))
				}
			}()
			for b.Loop() {
				ops[name](g)
			}
			close(stop)
			<-done
			b.ReportMetric(float64(worst.Microseconds()), "worst-admission-µs")
		})
	}
}
