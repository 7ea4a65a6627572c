package redislimit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// TestMinReplicasConfirmsEveryTake runs limiters against a master with two
// replicas. With MinReplicas 1 a granted slot is on a replica by the time
// AcquireSlot returns, so a failover to the most up-to-date replica (the one
// Sentinel promotes) keeps it. With the replicas frozen nothing is
// confirmed: FailClosed refuses (ErrUnavailable, counted as
// ErrorReplication) and the member the refused take wrote is removed; once
// the replicas resume the limiter recovers and grants again. A limiter with
// MinReplicas 0 grants while they are frozen: that slot exists on the master
// alone, and a failover would hand it out again.
func TestMinReplicasConfirmsEveryTake(t *testing.T) {
	s := tenantdbtest.StartRedisSentinel(t)
	t.Cleanup(func() { _ = s.FreezeReplicas(context.Background(), false) })
	master := newClient(t, s.MasterAddr)
	var replicas []*redis.Client
	for _, addr := range s.ReplicaAddrs {
		replicas = append(replicas, newClient(t, addr))
	}
	// onReplicas is the most leases of key a replica holds.
	onReplicas := func(key string) int64 {
		var most int64
		for _, r := range replicas {
			most = max(most, zcard(t, r, key))
		}
		return most
	}
	prefix := uniquePrefix(t)
	cfg := func(minReplicas int) Config {
		return Config{Client: newClient(t, s.MasterAddr), Prefix: prefix, Mode: FailClosed, MinReplicas: minReplicas,
			LeaseTTL: time.Minute, OpTimeout: 2 * time.Second, RecheckEvery: 100 * time.Millisecond}
	}
	confirmed := newLimiter(t, cfg(1))
	key := confirmed.SlotsKey("acme")
	var held []pool.ClusterLease
	for i := range 3 {
		held = append(held, mustAcquire(t, confirmed, "acme", 10))
		if n := onReplicas(key); n != int64(i+1) {
			t.Fatalf("take %d confirmed, but the replicas hold at most %d leases", i+1, n)
		}
	}

	if err := s.FreezeReplicas(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if _, err := confirmed.AcquireSlot(context.Background(), "acme", 10, 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("replicas frozen, MinReplicas 1: err = %v, want ErrUnavailable", err)
	}
	if st := confirmed.Stats(); st.ErrorsByKind[ErrorReplication] == 0 || st.Healthy {
		t.Errorf("replicas frozen, MinReplicas 1: %+v, want degraded by a replication error", st)
	}
	unconfirmed := newLimiter(t, cfg(0))
	mustAcquire(t, unconfirmed, "acme", 10).Release()

	if err := s.FreezeReplicas(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the limiter recovers", func() bool { return confirmed.Stats().Healthy })
	held = append(held, mustAcquire(t, confirmed, "acme", 10))
	eventually(t, 30*time.Second, "only the four granted slots are held, on the master and its replicas", func() bool {
		return zcard(t, master, key) == 4 && zcard(t, replicas[0], key) == 4 && zcard(t, replicas[1], key) == 4
	})
	for _, l := range held {
		l.Release()
	}
	assertNothingHeld(t, master, prefix, 30*time.Second, confirmed, unconfirmed)
}

// TestMinReplicasConfig refuses what cannot work: a negative count, and
// MinReplicas with a cluster client, which routes WAIT to any node rather
// than to the one that took the write.
func TestMinReplicasConfig(t *testing.T) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for name, cfg := range map[string]Config{
		"negative":       {Client: c, MinReplicas: -1},
		"cluster client": {Client: cc, MinReplicas: 1},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
}
