package redislimit

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

var sharedCluster struct {
	once sync.Once
	c    *tenantdbtest.RedisCluster
	err  error
}

// redisCluster returns the shared three-master cluster, started on first use
// and terminated by TestMain.
func redisCluster(t *testing.T) *tenantdbtest.RedisCluster {
	t.Helper()
	sharedCluster.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		sharedCluster.c, sharedCluster.err = tenantdbtest.RunRedisCluster(ctx)
	})
	if sharedCluster.err != nil {
		t.Fatal(sharedCluster.err)
	}
	return sharedCluster.c
}

func newClusterClient(t *testing.T, c *tenantdbtest.RedisCluster) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// clusterNode is one master: its client, address and ID.
type clusterNode struct {
	addr, id string
	c        *redis.Client
}

func clusterNodesOf(t *testing.T, c *tenantdbtest.RedisCluster) []clusterNode {
	var nodes []clusterNode
	for _, addr := range c.Addrs {
		cl := newClient(t, addr)
		id, err := cl.Do(context.Background(), "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, clusterNode{addr: addr, id: id, c: cl})
	}
	return nodes
}

// slotOwner returns the index among nodes of the master serving slot.
func slotOwner(t *testing.T, nodes []clusterNode, slot int64) int {
	slots, err := nodes[0].c.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) {
			for i, n := range nodes {
				if n.addr == s.Nodes[0].Addr {
					return i
				}
			}
		}
	}
	t.Fatalf("no node serves slot %d", slot)
	return -1
}

// TestRedisClusterThreeMastersShareCaps runs three limiters (three
// processes) through ClusterClients on a three-master cluster, with tenants
// whose slots live on different masters, and checks the holders counted
// outside Redis against the cap at every take.
func TestRedisClusterThreeMastersShareCaps(t *testing.T) {
	c := redisCluster(t)
	nodes := clusterNodesOf(t, c)
	prefix := uniquePrefix(t)
	// Tenants until every master owns one.
	var tenants []string
	owners := map[int]bool{}
	for i := 0; len(owners) < len(nodes) && i < 1000; i++ {
		tenant := "t" + strconv.Itoa(i)
		slot, err := nodes[0].c.ClusterKeySlot(context.Background(), tenantKeys(prefix, tenant).slots).Result()
		if err != nil {
			t.Fatal(err)
		}
		if o := slotOwner(t, nodes, slot); !owners[o] {
			owners[o] = true
			tenants = append(tenants, tenant)
		}
	}
	// This test is about caps across masters, not about outages: a loaded
	// machine (the race detector, other packages' containers starting) once
	// kept a take past the default 500 ms OpTimeout, and fail-open then
	// granted past the cap. FailClosed with a generous OpTimeout keeps the
	// assertion about the cap; a slow answer still fails the test, as an error.
	var ls []*Limiter
	for range 3 {
		ls = append(ls, newLimiter(t, Config{Client: newClusterClient(t, c), Prefix: prefix, Mode: FailClosed,
			OpTimeout: 3 * time.Second, RecheckEvery: 200 * time.Millisecond}))
	}
	peaks := hammer(t, ls, tenants, 3, 30, nil)
	for i, p := range peaks {
		if p != 3 {
			t.Errorf("tenant %s: peak holders %d, want the cap 3 reached and never passed", tenants[i], p)
		}
	}
	assertNothingHeld(t, ls[0].client, prefix, 10*time.Second, ls...)
	for i, l := range ls {
		if st := l.Stats(); st.Errors != 0 || st.LostLeases != 0 {
			t.Errorf("limiter %d: %+v, want no errors or lost leases", i, st)
		}
	}
}

// hammer runs 6 goroutines per limiter taking and releasing slots of
// tenants (cap limit each), rounds times each, and returns each tenant's
// peak of holders; it fails t when one exceeds the cap. Errors matching
// allowed are tolerated (counted as rejections).
func hammer(t *testing.T, ls []*Limiter, tenants []string, limit, rounds int, allowed error) []int32 {
	holders := make([]atomic.Int32, len(tenants))
	peak := make([]atomic.Int32, len(tenants))
	var wg sync.WaitGroup
	for _, l := range ls {
		for g := range 6 {
			wg.Go(func() {
				for i := range rounds {
					ti := (g + i) % len(tenants)
					maxWait := []time.Duration{0, 20 * time.Millisecond, -1}[rand.IntN(3)]
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					s, err := l.AcquireSlot(ctx, tenants[ti], limit, maxWait)
					cancel()
					if err != nil {
						if !isOverLimit(err) && !errors.Is(err, context.DeadlineExceeded) && (allowed == nil || !errors.Is(err, allowed)) {
							t.Errorf("AcquireSlot: %v", err)
						}
						continue
					}
					n := holders[ti].Add(1)
					for p := peak[ti].Load(); n > p && !peak[ti].CompareAndSwap(p, n); p = peak[ti].Load() {
					}
					if n > int32(limit) && !s.Local() {
						t.Errorf("%d holders of %s, cap %d", n, tenants[ti], limit)
					}
					time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
					holders[ti].Add(-1)
					s.Release()
				}
			})
		}
	}
	wg.Wait()
	out := make([]int32, len(tenants))
	for i := range peak {
		out[i] = peak[i].Load()
	}
	return out
}

// TestRedisClusterNotificationAcrossNodes: a waiter of one process is woken
// by a release in another through the cluster (the PUBLISH runs on the
// tenant's master, the cluster bus carries it to every node), and a client
// subscribed on another master sees it too.
func TestRedisClusterNotificationAcrossNodes(t *testing.T) {
	c := redisCluster(t)
	nodes := clusterNodesOf(t, c)
	prefix := uniquePrefix(t)
	slow := Config{Prefix: prefix, LeaseTTL: time.Hour, RecheckEvery: 10 * time.Minute}
	holderCfg, waiterCfg := slow, slow
	holderCfg.Client, waiterCfg.Client = newClusterClient(t, c), newClusterClient(t, c)
	holder, waiter := newLimiter(t, holderCfg), newLimiter(t, waiterCfg)
	asleep := sleeping(waiter)

	k := tenantKeys(prefix, "acme")
	slot, err := nodes[0].c.ClusterKeySlot(context.Background(), k.slots).Result()
	if err != nil {
		t.Fatal(err)
	}
	other := nodes[(slotOwner(t, nodes, slot)+1)%len(nodes)]
	ps := other.c.Subscribe(context.Background(), k.channel)
	defer ps.Close()
	if _, err := ps.Receive(context.Background()); err != nil { // the confirmation
		t.Fatal(err)
	}

	s := mustAcquire(t, holder, "acme", 1)
	done := acquireAsync(waiter, "acme", 1, -1)
	awaitSleep(t, asleep, "acme")
	s.Release()
	got := receive(t, done, "the waiter")
	if got.err != nil {
		t.Fatalf("waiter: %v", got.err)
	}
	got.s.Release()
	if st := waiter.Stats(); st.Wakeups < 1 {
		t.Errorf("the waiter was not woken by a notification: %+v", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg, err := ps.ReceiveMessage(ctx)
	if err != nil || msg.Channel != k.channel {
		t.Errorf("a subscriber on another master (%s): %v, %v", other.addr, msg, err)
	}
}

// TestRedisClusterSlotMigration moves a tenant's slot to another master
// (MIGRATING/IMPORTING, MIGRATE, SETSLOT NODE) while three limiters take
// and release its slots: clients follow the ASK and MOVED redirections,
// and the cap holds throughout. Multi-key scripts may meet TRYAGAIN while
// the keys are split between the masters; the limiter then follows its
// Mode (FailClosed here: refuses), never exceeding the cap.
func TestRedisClusterSlotMigration(t *testing.T) {
	c := redisCluster(t)
	nodes := clusterNodesOf(t, c)
	prefix := uniquePrefix(t)
	ctx := context.Background()
	k := tenantKeys(prefix, "acme")
	slot, err := nodes[0].c.ClusterKeySlot(ctx, k.slots).Result()
	if err != nil {
		t.Fatal(err)
	}
	srcI := slotOwner(t, nodes, slot)
	src, dst := nodes[srcI], nodes[(srcI+1)%len(nodes)]
	var ls []*Limiter
	for range 3 {
		ls = append(ls, newLimiter(t, Config{Client: newClusterClient(t, c), Prefix: prefix, Mode: FailClosed,
			RecheckEvery: 50 * time.Millisecond}))
	}
	peaks := make(chan []int32, 1)
	hammered := make(chan struct{})
	go func() {
		defer close(hammered)
		peaks <- hammer(t, ls, []string{"acme"}, 3, 60, ErrUnavailable)
	}()
	// A t.Fatalf below ends the test while hammer runs: wait for it before
	// the limiters close under it (cleanups run last-registered first) and
	// before its t.Errorf could come after the test, which panics the
	// whole test binary.
	t.Cleanup(func() { <-hammered })

	eventually(t, 10*time.Second, "load on the slot", func() bool { return ls[0].Stats().Acquired > 5 })
	must := func(n clusterNode, args ...any) {
		if err := n.c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%s %v: %v", n.addr, args, err)
		}
	}
	must(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id)
	must(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id)
	time.Sleep(200 * time.Millisecond) // the scenario: takes during the migration, redirected by ASK
	host, port, _ := net.SplitHostPort(dst.addr)
	for {
		keys, err := src.c.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "REPLACE", "KEYS"}
		for _, key := range keys {
			args = append(args, key)
		}
		if err := src.c.Do(ctx, args...).Err(); err != nil && !strings.Contains(err.Error(), "NOKEY") {
			t.Fatalf("MIGRATE: %v", err)
		}
	}
	for _, n := range nodes {
		must(n, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
	}
	p := <-peaks
	if p[0] > 3 {
		t.Errorf("peak holders %d, cap 3", p[0])
	}
	if o := slotOwner(t, nodes, slot); nodes[o].addr != dst.addr {
		t.Fatalf("the slot is on %s after the migration, want %s", nodes[o].addr, dst.addr)
	}
	for _, l := range ls {
		eventually(t, 10*time.Second, "healthy", func() bool { return l.Stats().Healthy })
		mustAcquire(t, l, "acme", 3).Release()
	}
	assertNothingHeld(t, ls[0].client, prefix, 10*time.Second, ls...)
	for i, l := range ls {
		st := l.Stats()
		t.Logf("limiter %d: errors by kind %v, acquired %d, failclosed %d", i, st.ErrorsByKind, st.Acquired, st.FailClosedErrors)
		if st.LostLeases != 0 {
			t.Errorf("limiter %d lost %d leases in the migration", i, st.LostLeases)
		}
		if n := st.ErrorsByKind[ErrorScript]; n != 0 {
			t.Errorf("limiter %d: %d errors classified as script errors: the migration's should be cluster errors", i, n)
		}
	}
}
