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
		if got := g.Stats().Tenants; got != n {
			b.Fatalf("tracked %d tenants, want %d", got, n)
		}
		g.EvictIdle() // stamps every idle tenant
		clock += int64(2 * time.Hour)
		g.EvictIdle() // evicts them
		if got := g.Stats().Tenants; got != 0 {
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
