package redislimit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// TestRedisIdleTenantKeysExpire checks that no key lives without an expiry,
// and that the keys of a tenant whose process died vanish on their own.
func TestRedisIdleTenantKeysExpire(t *testing.T) {
	const ttl = time.Second
	l := newLimiter(t, Config{LeaseTTL: ttl, RecheckEvery: 100 * time.Millisecond})
	mustAcquire(t, l, "acme", 1)
	if _, err := l.AcquireSlot(context.Background(), "acme", 1, 20*time.Millisecond); !isOverLimit(err) {
		t.Fatalf("err = %v, want ErrOverLimit after waiting", err)
	}
	keys := keysOf(t, l.client, l.cfg.Prefix)
	if len(keys) != 2 {
		t.Fatalf("keys %v, want the sorted set and the waiter mark", keys)
	}
	for _, k := range keys {
		pttl, err := l.client.PTTL(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pttl <= 0 || pttl > 2*ttl {
			t.Errorf("PTTL %s = %v, want in (0, %v]", k, pttl, 2*ttl)
		}
	}
	crash(l)
	eventually(t, 2*ttl+10*time.Second, "the dead tenant's keys expire", func() bool {
		return len(keysOf(t, l.client, l.cfg.Prefix)) == 0
	})
}

// TestRedisClusterHashTags runs against a Redis in cluster mode (one node
// owning every slot), where a script may only touch keys of one slot: every
// key and the channel of a tenant must hash to the same slot, whatever the
// tenant ID holds, and waiting, waking and releasing must work through a
// ClusterClient.
func TestRedisClusterHashTags(t *testing.T) {
	r := tenantdbtest.StartRedis(t, tenantdbtest.WithRedisArgs("--cluster-enabled", "yes"))
	ctx := context.Background()
	admin := newClient(t, r.Addr)
	eventually(t, 30*time.Second, "the node owns every slot", func() bool {
		_ = admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err() // fails once done
		info, err := admin.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	})
	newCluster := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{
			// The node announces its address inside Docker; tell the client
			// the published one.
			ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
				return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: r.Addr}}}}, nil
			},
		})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	prefix := uniquePrefix(t)
	tenants := []string{"acme", "a{b}c", "x:y}", "{", "日本", "50%:x"}
	for _, tenant := range tenants {
		k := tenantKeys(prefix, tenant)
		var slots []int64
		for _, name := range []string{k.slots, k.waiting, k.channel} {
			if !strings.HasPrefix(name, "{"+prefix+":"+tenantEscaper.Replace(tenant)+"}:") {
				t.Errorf("%q does not begin with the tenant's hash tag", name)
			}
			s, err := admin.ClusterKeySlot(ctx, name).Result()
			if err != nil {
				t.Fatal(err)
			}
			slots = append(slots, s)
		}
		if slots[0] != slots[1] || slots[0] != slots[2] {
			t.Errorf("tenant %q: keys in slots %v, want one", tenant, slots)
		}
	}

	a := newLimiter(t, Config{Client: newCluster(), Prefix: prefix, LeaseTTL: time.Hour, OpTimeout: testOpTimeout, RecheckEvery: 10 * time.Minute})
	b := newLimiter(t, Config{Client: newCluster(), Prefix: prefix, LeaseTTL: time.Hour, OpTimeout: testOpTimeout, RecheckEvery: 10 * time.Minute})
	asleep := sleeping(b)
	for _, tenant := range tenants {
		s := mustAcquire(t, a, tenant, 1)
		if _, err := b.AcquireSlot(ctx, tenant, 1, 0); !isOverLimit(err) {
			t.Fatalf("tenant %q: err = %v, want ErrOverLimit", tenant, err)
		}
		w := acquireAsync(b, tenant, 1, -1)
		awaitSleep(t, asleep, tenant)
		s.Release()
		got := receive(t, w, "waiter")
		if got.err != nil || got.s.Local() {
			t.Fatalf("tenant %q: waiter got %v, %v", tenant, got.s, got.err)
		}
		got.s.Release()
	}
	if st := b.Stats(); st.Wakeups != uint64(len(tenants)) || st.Errors != 0 {
		t.Errorf("stats %+v, want %d wake-ups and no errors", st, len(tenants))
	}
	assertNothingHeld(t, admin, prefix, 10*time.Second, a, b)
}

// TestRedisPrefixesDoNotShareKeys runs two deployments on one Redis whose
// prefix and tenant, joined by ':', spell the same string: "billing" with
// tenant "eu:acme" and "billing:eu" with tenant "acme". Each must get its own
// slot, and the sorted sets must be distinct keys.
func TestRedisPrefixesDoNotShareKeys(t *testing.T) {
	ctx := context.Background()
	base := uniquePrefix(t)
	a := newLimiter(t, Config{Prefix: base})
	b := newLimiter(t, Config{Prefix: base + ":eu"})
	if a.SlotsKey("eu:acme") == b.SlotsKey("acme") {
		t.Fatalf("both deployments use %q", a.SlotsKey("eu:acme"))
	}
	sa := mustAcquire(t, a, "eu:acme", 1)
	defer sa.Release()
	sb, err := b.AcquireSlot(ctx, "acme", 1, 0)
	if err != nil {
		t.Fatalf("the other deployment's tenant: %v, want its own slot", err)
	}
	sb.Release()
	// A tenant holding the escape character must not meet one holding what
	// it escapes to.
	sc := mustAcquire(t, a, "x%3Ay", 1)
	defer sc.Release()
	sd, err := a.AcquireSlot(ctx, "x:y", 1, 0)
	if err != nil {
		t.Fatalf("tenant x:y: %v, want a slot of its own", err)
	}
	sd.Release()
}
