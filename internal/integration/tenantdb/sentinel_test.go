package tenantdb_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool/redislimit"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// TestSentinelFailoverUnderLoad fails the master over to its replica
// (SENTINEL FAILOVER) while two pools, FailClosed, flood one tenant through
// Sentinel failover clients. The clients follow the switch (the old master
// answers READONLY once demoted: classified, degraded, reconciled); the
// tenant's active backends, counted by PostgreSQL across both pools, never
// exceed its cap (excess 0), and both pools serve through the new master.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	t.Run("sentinel-failover", func(t *testing.T) {
		s := tenantdbtest.StartRedisSentinel(t)
		sentinelFlood(t, s, func() {
			if err := s.Failover(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	})
	// The master freezes (SIGSTOP): nothing answers until the sentinels,
	// after a second of silence, promote the replica. Leases are not
	// renewed meanwhile; FailClosed revokes them on time and refuses new
	// requests until the client finds the new master.
	t.Run("master-frozen", func(t *testing.T) {
		s := tenantdbtest.StartRedisSentinel(t)
		t.Cleanup(func() { _ = s.Freeze(context.Background(), false) })
		sentinelFlood(t, s, func() {
			if err := s.Freeze(context.Background(), true); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// sentinelFlood floods a tenant from two pools through Sentinel failover
// clients, calls failover, waits until the sentinels report the replica as
// master and both pools serve through it, and checks the peak of the
// tenant's active backends against its cap.
func sentinelFlood(t *testing.T, s *tenantdbtest.RedisSentinel, failover func()) {
	tag := clusterTag()
	marker := "sentinel tag=" + tag
	prefix := "sentinel-" + tag
	const cap = 4
	type side struct {
		lim    *redislimit.Limiter
		p      *tenantdb.Pool
		served atomic.Int64
	}
	var sides []*side
	for range 2 {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs})
		t.Cleanup(func() { _ = rdb.Close() })
		lim, err := redislimit.New(redislimit.Config{Client: rdb, Prefix: prefix, Mode: redislimit.FailClosed,
			LeaseTTL: 2 * time.Second, OpTimeout: 300 * time.Millisecond, RecheckEvery: 100 * time.Millisecond,
			MinReplicas: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(lim.Close)
		p := newPool(t, sharedPG, clusterMaxConns, tenantdb.Config{
			Plans: map[string]tenantdb.Plan{"p": {MaxConns: cap, MaxWaiting: tenantdb.Unbounded}}, Cluster: lim})
		sides = append(sides, &side{lim: lim, p: p})
	}
	sampler := startActivitySampler(t, marker)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var unavailable, revoked atomic.Int64
	sql := "select pg_sleep(0.02) /* " + marker + " */"
	for _, sd := range sides {
		for range 2 * cap {
			wg.Go(func() {
				for ctx.Err() == nil {
					qctx, cancel := context.WithTimeout(tenantdb.WithTenant(ctx, "acme"), 30*time.Second)
					_, err := sd.p.Exec(qctx, sql)
					cancel()
					switch {
					case err == nil:
						sd.served.Add(1)
					case errors.Is(err, redislimit.ErrUnavailable):
						unavailable.Add(1)
						time.Sleep(time.Millisecond) // a client backing off
					case errors.Is(err, tenantdb.ErrRevoked):
						revoked.Add(1)
					case ctx.Err() == nil:
						t.Errorf("flood: %v", err)
					}
				}
			})
		}
	}
	defer func() { stop(); wg.Wait() }()
	eventually(t, "both serve", func() bool { return sides[0].served.Load() >= 20 && sides[1].served.Load() >= 20 })

	failover()
	failedOver := time.Now()
	admin := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddrs[0]})
	defer admin.Close()
	eventually(t, "the sentinels report a replica as master", func() bool {
		addr, err := admin.GetMasterAddrByName(context.Background(), s.MasterName).Result()
		return err == nil && len(addr) == 2 && slices.Contains(s.ReplicaAddrs, addr[0]+":"+addr[1])
	})
	n0, n1 := sides[0].served.Load(), sides[1].served.Load()
	eventually(t, "both serve through the new master", func() bool {
		return sides[0].served.Load() >= n0+50 && sides[1].served.Load() >= n1+50 &&
			sides[0].lim.Stats().Healthy && sides[1].lim.Stats().Healthy
	})
	recovered := time.Since(failedOver)
	stop()
	wg.Wait()
	peak := sampler.stop()
	t.Logf("%s (FailClosed): peak %d active backends of cap %d (excess %d); served %d and %d; "+
		"%d refused as unavailable, %d revoked; both healthy and serving %v after the failover",
		t.Name(), peak, cap, max(0, peak-cap), sides[0].served.Load(), sides[1].served.Load(), unavailable.Load(), revoked.Load(),
		recovered.Round(time.Millisecond))
	for i, sd := range sides {
		t.Logf("pool %d limiter: %+v", i, sd.lim.Stats())
	}
	if peak > cap {
		t.Errorf("peak active backends %d, cap %d: excess %d, want 0", peak, cap, peak-cap)
	}
	for _, sd := range sides {
		assertNothingHeld(t, sd.p)
	}
}
