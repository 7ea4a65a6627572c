package redislimit

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool"
)

// roundTrips counts what a client sends: one per command, one per
// pipeline. (The pub/sub connection bypasses hooks; uncontended benchmarks
// never subscribe.)
type roundTrips struct{ n atomic.Int64 }

func (c *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// benchLimiter returns a limiter whose client counts round trips.
func benchLimiter(b *testing.B) (*Limiter, *roundTrips) {
	rdb := newClient(b, sharedRedis(b))
	rt := &roundTrips{}
	rdb.AddHook(rt)
	return newLimiter(b, Config{Client: rdb}), rt
}

func benchGate(b *testing.B, cluster pool.ClusterLimiter) *pool.Gate {
	g, err := pool.New(pool.Config{
		Capacity: 100,
		Plans:    map[string]pool.Plan{"p": {MaxConns: 10}},
		Cluster:  cluster,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(g.Close)
	return g
}

// report adds the round trips per operation, counted from when the timer
// started, including the background flushes the operations caused.
func report(b *testing.B, rt *roundTrips, start int64) {
	b.ReportMetric(float64(rt.n.Load()-start)/float64(b.N), "roundtrips/op")
}

// BenchmarkGateLocal is the local-only path: a bare pool.Gate, one
// acquire and release per op.
func BenchmarkGateLocal(b *testing.B) {
	g := benchGate(b, nil)
	ctx := context.Background()
	for b.Loop() {
		p, err := g.Acquire(ctx, "acme")
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
	}
	b.ReportMetric(0, "roundtrips/op")
}

// BenchmarkGateRedis is the same with a Limiter behind the gate: the added
// cost per acquire and release, on loopback. A release is flushed in the
// background or carried by the next take of the tenant, so one op costs
// between one and two round trips.
func BenchmarkGateRedis(b *testing.B) {
	l, rt := benchLimiter(b)
	g := benchGate(b, l)
	ctx := context.Background()
	start := rt.n.Load()
	for b.Loop() {
		p, err := g.Acquire(ctx, "acme")
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
	}
	b.StopTimer()
	report(b, rt, start)
}

// BenchmarkLimiterRedis is the Limiter alone.
func BenchmarkLimiterRedis(b *testing.B) {
	l, rt := benchLimiter(b)
	ctx := context.Background()
	start := rt.n.Load()
	for b.Loop() {
		s, err := l.AcquireSlot(ctx, "acme", 10, 0)
		if err != nil {
			b.Fatal(err)
		}
		s.Release()
	}
	b.StopTimer()
	report(b, rt, start)
}

// BenchmarkGateRedisParallel runs GOMAXPROCS goroutines, each its own
// tenant, so that releases of one tenant cannot ride on its next take as
// often and background flushes batch releases of several tenants.
func BenchmarkGateRedisParallel(b *testing.B) {
	l, rt := benchLimiter(b)
	g := benchGate(b, l)
	var id atomic.Int32
	start := rt.n.Load()
	b.RunParallel(func(pb *testing.PB) {
		tenant := "t" + strconv.Itoa(int(id.Add(1)))
		ctx := context.Background()
		for pb.Next() {
			p, err := g.Acquire(ctx, tenant)
			if err != nil {
				b.Error(err)
				return
			}
			p.Release()
		}
	})
	b.StopTimer()
	report(b, rt, start)
}

// BenchmarkGateLocalParallel is BenchmarkGateRedisParallel's local-only twin.
func BenchmarkGateLocalParallel(b *testing.B) {
	g := benchGate(b, nil)
	var id atomic.Int32
	b.RunParallel(func(pb *testing.PB) {
		tenant := "t" + strconv.Itoa(int(id.Add(1)))
		ctx := context.Background()
		for pb.Next() {
			p, err := g.Acquire(ctx, tenant)
			if err != nil {
				b.Error(err)
				return
			}
			p.Release()
		}
	})
	b.ReportMetric(0, "roundtrips/op")
}

// BenchmarkRedisPing is the floor: one PING round trip to the same server
// through the same kind of client.
func BenchmarkRedisPing(b *testing.B) {
	rdb := newClient(b, sharedRedis(b))
	ctx := context.Background()
	for b.Loop() {
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(1, "roundtrips/op")
}
