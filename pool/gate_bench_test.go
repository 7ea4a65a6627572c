package pool_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/tenantdb/tenantdb/pool"
)

// newBenchGate is a Gate on cfg, closed at the end of the benchmark, to
// which tenant acme is known already.
func newBenchGate(b *testing.B, cfg pool.Config) *pool.Gate {
	b.Helper()
	g, err := pool.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(g.Close)
	p, err := g.Acquire(context.Background(), "acme")
	if err != nil {
		b.Fatal(err)
	}
	p.Release()
	return g
}

// benchAcquireRelease measures one uncontended acquire and release of
// tenant acme on g.
func benchAcquireRelease(b *testing.B, g *pool.Gate) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := g.Acquire(ctx, "acme")
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
	}
}

// BenchmarkUncontended compares one acquire+release for a known tenant with
// the two primitives it is built from, measured in the same run so the ratio
// holds on a noisy machine.
func BenchmarkUncontended(b *testing.B) {
	ctx := context.Background()
	b.Run("Gate", func(b *testing.B) {
		benchAcquireRelease(b, newBenchGate(b, pool.Config{Capacity: 20, Plans: map[string]pool.Plan{"p": {MaxConns: 10}}}))
	})
	b.Run("GateAdaptive", func(b *testing.B) { // every hold timed and fed to the controller
		benchAcquireRelease(b, newBenchGate(b, pool.Config{Capacity: 20, Plans: map[string]pool.Plan{"p": {MaxConns: 10}},
			Adaptive: pool.Adaptive{Enabled: true}}))
	})
	b.Run("GateBudget", func(b *testing.B) { // every hold timed and charged to a budget that never runs out
		benchAcquireRelease(b, newBenchGate(b, pool.Config{Capacity: 20, Plans: map[string]pool.Plan{"p": {MaxConns: 10,
			Budget: pool.Budget{Rate: 1e6}}}}))
	})
	b.Run("XSyncSemaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(10)
		b.ReportAllocs()
		for b.Loop() {
			if err := s.Acquire(ctx, 1); err != nil {
				b.Fatal(err)
			}
			s.Release(1)
		}
	})
	b.Run("ChannelSemaphore", func(b *testing.B) {
		s := make(chan struct{}, 10)
		b.ReportAllocs()
		for b.Loop() {
			select {
			case s <- struct{}{}:
			case <-ctx.Done():
				b.Fatal(ctx.Err())
			}
			<-s
		}
	})
}

// BenchmarkParallel acquires and releases from all procs, spread over n tenants.
func BenchmarkParallel(b *testing.B) {
	for _, n := range []int{1, 100, 10_000} {
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			g, err := pool.New(pool.Config{Capacity: 1000, Plans: map[string]pool.Plan{"p": {MaxConns: 1000, MaxWaiting: pool.Unbounded}}})
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprintf("tenant-%d", i)
			}
			var next atomic.Uint64
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := next.Add(7919)
				for pb.Next() {
					i++
					p, err := g.Acquire(ctx, ids[i%uint64(n)])
					if err != nil {
						b.Error(err)
						return
					}
					p.Release()
				}
			})
		})
	}
}

// BenchmarkRejection measures a rejected Acquire against an uncontended
// acquire+release in the same run: rejections come by the thousand exactly
// when a noisy tenant floods, so they must cost no more than a grant.
func BenchmarkRejection(b *testing.B) {
	ctx := context.Background()
	newGate := func(b *testing.B, maxWaiting int) *pool.Gate {
		return newBenchGate(b, pool.Config{Capacity: 20, Plans: map[string]pool.Plan{"p": {MaxConns: 1, MaxWaiting: maxWaiting}}})
	}
	b.Run("Uncontended", func(b *testing.B) { benchAcquireRelease(b, newGate(b, 0)) })
	b.Run("AtCap", func(b *testing.B) { // MaxWaiting 0: over the cap is rejected
		g := newGate(b, 0)
		held, _ := g.Acquire(ctx, "acme")
		defer held.Release()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := g.Acquire(ctx, "acme"); err == nil {
				b.Fatal("not rejected")
			}
		}
	})
	b.Run("QueueFull", func(b *testing.B) { // MaxWaiting 1, and one waits
		g := newGate(b, 1)
		held, _ := g.Acquire(ctx, "acme")
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _, _ = g.Acquire(wctx, "acme"); close(done) }()
		for g.Stat().Waiting != 1 {
			runtime.Gosched()
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := g.Acquire(ctx, "acme"); err == nil {
				b.Fatal("not rejected")
			}
		}
		b.StopTimer()
		cancel()
		<-done
		held.Release()
	})
}

// BenchmarkBudgetOverhead is the cost of a budget on an uncontended
// acquire+release: a Gate without one and a Gate whose plan has a budget
// that never runs out, in turn, 200 acquire+release at a time, so that a
// loaded machine's drift falls on both alike; the batches another process
// interrupted are left out by taking each one's median batch. It reports
// each one's median time per acquire+release and their ratio (issue 46
// asks at most 1.05).
func BenchmarkBudgetOverhead(b *testing.B) {
	ctx := context.Background()
	newGate := func(budget pool.Budget) *pool.Gate {
		g, err := pool.New(pool.Config{Capacity: 20, Plans: map[string]pool.Plan{"p": {MaxConns: 10, Budget: budget}}})
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	gates := [2]*pool.Gate{newGate(pool.Budget{}), newGate(pool.Budget{Rate: 1e6})}
	var batches [2][]time.Duration
	const batch = 200
	for b.Loop() {
		for i, g := range gates {
			began := time.Now()
			for range batch {
				p, err := g.Acquire(ctx, "acme")
				if err != nil {
					b.Fatal(err)
				}
				p.Release()
			}
			batches[i] = append(batches[i], time.Since(began))
		}
	}
	var med [2]float64
	for i := range batches {
		slices.Sort(batches[i])
		med[i] = float64(batches[i][len(batches[i])/2]) / batch
	}
	b.ReportMetric(med[0], "plain-ns/op")
	b.ReportMetric(med[1], "budget-ns/op")
	b.ReportMetric(med[1]/med[0], "budget/plain")
}
