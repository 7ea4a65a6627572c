package tenantdb_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool/redislimit"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// TestRedisClusterPoolsShareCap runs three pools, FailClosed, through
// ClusterClients on a three-master Redis Cluster, flooding three tenants
// whose keys live on different masters. PostgreSQL's own count of each
// tenant's active backends across the pools never exceeds its cap.
func TestRedisClusterPoolsShareCap(t *testing.T) {
	rc := tenantdbtest.StartRedisCluster(t)
	tag := clusterTag()
	prefix := "rcluster-" + tag
	const cap = 3
	var pools []*tenantdb.Pool
	var lims []*redislimit.Limiter
	for range 3 {
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs})
		t.Cleanup(func() { _ = cc.Close() })
		// The test is about caps across masters, not slow answers: with the
		// default 500ms OpTimeout, calls slowed by this loaded machine
		// degraded a limiter and FailClosed refused the flood (3 timeouts
		// in one run of the cluster tests). As in pool/redislimit's
		// three-master test, 3s; a slow answer still fails the test.
		lim, err := redislimit.New(redislimit.Config{Client: cc, Prefix: prefix, Mode: redislimit.FailClosed,
			OpTimeout: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(lim.Close)
		lims = append(lims, lim)
		pools = append(pools, newPool(t, sharedPG, clusterMaxConns, tenantdb.Config{
			Plans: map[string]tenantdb.Plan{"p": {MaxConns: cap, MaxWaiting: tenantdb.Unbounded}}, Cluster: lim}))
	}
	// Tenants on three different masters.
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs})
	defer admin.Close()
	masterOf := func(key string) string {
		slot, err := admin.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots, err := admin.ClusterSlots(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) {
				return s.Nodes[0].Addr
			}
		}
		t.Fatalf("no master for slot %d", slot)
		return ""
	}
	var tenants []string
	seen := map[string]bool{}
	for i := 0; len(tenants) < 3 && i < 1000; i++ {
		tenant := "t" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if m := masterOf(lims[0].SlotsKey(tenant)); !seen[m] {
			seen[m] = true
			tenants = append(tenants, tenant)
		}
	}
	if len(tenants) != 3 {
		t.Fatalf("tenants on 3 masters: found %v", tenants)
	}
	samplers := make([]*activitySampler, len(tenants))
	for i, tenant := range tenants {
		samplers[i] = startActivitySampler(t, "rcluster tenant="+tenant+" tag="+tag)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var served atomic.Int64
	for _, p := range pools {
		for w := range 2 * cap * len(tenants) {
			tenant := tenants[w%len(tenants)]
			sql := "select pg_sleep(0.02) /* rcluster tenant=" + tenant + " tag=" + tag + " */"
			wg.Go(func() {
				for ctx.Err() == nil {
					qctx, cancel := context.WithTimeout(tenantdb.WithTenant(ctx, tenant), 30*time.Second)
					_, err := p.Exec(qctx, sql)
					cancel()
					if err == nil {
						served.Add(1)
					} else if ctx.Err() == nil {
						t.Errorf("flood %s: %v", tenant, err)
					}
				}
			})
		}
	}
	// Each tenant's flood fills its cap at some moment; a busy machine may
	// take longer to show it than 300 queries.
	eventually(t, "300 queries served and each tenant's cap filled", func() bool {
		for _, s := range samplers {
			if s.peak() < cap {
				return false
			}
		}
		return served.Load() >= 300
	})
	stop()
	wg.Wait()
	for i, s := range samplers {
		peak := s.stop()
		t.Logf("tenant %s (master %s): peak %d active backends across 3 pools, cap %d (excess %d)",
			tenants[i], masterOf(lims[0].SlotsKey(tenants[i])), peak, cap, max(0, peak-cap))
		if peak > cap {
			t.Errorf("tenant %s: peak %d active backends, cap %d", tenants[i], peak, cap)
		}
		if peak < cap {
			t.Errorf("tenant %s: peak %d, the flood did not fill the cap %d", tenants[i], peak, cap)
		}
	}
	for i, l := range lims {
		if st := l.Stats(); st.Errors != 0 || st.LostLeases != 0 {
			t.Errorf("limiter %d: %+v, want no errors", i, st)
		}
	}
	for _, p := range pools {
		assertNothingHeld(t, p)
	}
}
