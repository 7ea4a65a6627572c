package redislimit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

type acquired struct {
	s   pool.ClusterLease
	err error
}

func acquireAsync(l *Limiter, tenant string, limit int, maxWait time.Duration) <-chan acquired {
	c := make(chan acquired, 1)
	go func() {
		s, err := l.AcquireSlot(context.Background(), tenant, limit, maxWait)
		c <- acquired{s, err}
	}()
	return c
}

func receive(t *testing.T, c <-chan acquired, what string) acquired {
	t.Helper()
	select {
	case a := <-c:
		return a
	case <-time.After(time.Minute):
		t.Fatalf("%s: no answer", what)
		return acquired{}
	}
}

// TestRedisOutageFailOpenAndFailClosed stops the Redis container while two
// processes, one per mode, hold slots and wait for more, then starts it
// again. FailOpen hands out local leases, FailClosed errors matching
// ErrUnavailable, both at once rather than after waiting; after the restart
// both use Redis again and every slot is released (the lease TTL is far
// longer than the test, so the slots are not merely expiring).
func TestRedisOutageFailOpenAndFailClosed(t *testing.T) {
	r := tenantdbtest.StartRedis(t)
	prefix := uniquePrefix(t)
	rdb := newClient(t, r.Addr)
	cfg := func(m Mode) Config {
		return Config{Client: newClient(t, r.Addr), Prefix: prefix, Mode: m, LeaseTTL: time.Minute,
			OpTimeout: 300 * time.Millisecond, RecheckEvery: 100 * time.Millisecond}
	}
	open, closed := newLimiter(t, cfg(FailOpen)), newLimiter(t, cfg(FailClosed))
	heldOpen := mustAcquire(t, open, "acme", 2)
	heldClosed := mustAcquire(t, closed, "acme", 2)
	openWaiter := acquireAsync(open, "acme", 2, -1)
	closedWaiter := acquireAsync(closed, "acme", 2, -1)
	eventually(t, 10*time.Second, "both wait", func() bool {
		return open.Stats().Waited == 1 && closed.Stats().Waited == 1
	})

	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The waiters are answered by the failure mode, not left waiting.
	if a := receive(t, openWaiter, "fail-open waiter"); a.err != nil || !a.s.Local() {
		t.Fatalf("fail-open waiter: lease %v, err %v; want a local lease", a.s, a.err)
	} else {
		a.s.Release()
	}
	if a := receive(t, closedWaiter, "fail-closed waiter"); !errors.Is(a.err, ErrUnavailable) || isOverLimit(a.err) {
		t.Fatalf("fail-closed waiter: err = %v, want ErrUnavailable", a.err)
	}
	// New requests too, whether or not they may wait.
	var grants []pool.ClusterLease
	for _, maxWait := range []time.Duration{0, -1} {
		s, err := open.AcquireSlot(context.Background(), "acme", 2, maxWait)
		if err != nil || !s.Local() {
			t.Fatalf("fail-open, Redis down: lease %v, err %v; want a local lease", s, err)
		}
		grants = append(grants, s)
		if _, err := closed.AcquireSlot(context.Background(), "acme", 2, maxWait); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("fail-closed, Redis down: err = %v, want ErrUnavailable", err)
		}
	}
	for name, l := range map[string]*Limiter{"fail-open": open, "fail-closed": closed} {
		st := l.Stats()
		if st.Healthy || st.Degradations != 1 || st.Errors == 0 {
			t.Errorf("%s during the outage: %+v, want degraded once, errors counted", name, st)
		}
	}
	if st := open.Stats(); st.FailOpenGrants != 3 || st.LocalHeld != 2 {
		t.Errorf("fail-open: %d grants, %d local held; want 3 and 2", st.FailOpenGrants, st.LocalHeld)
	}
	if st := closed.Stats(); st.FailClosedErrors != 3 {
		t.Errorf("fail-closed: %d errors, want 3", st.FailClosedErrors)
	}
	// Releases during the outage cannot reach Redis; they are kept.
	heldOpen.Release()
	heldClosed.Release()

	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "both probe Redis healthy", func() bool {
		return open.Stats().Healthy && closed.Stats().Healthy
	})
	// The fail-open grants still held were put in Redis before the limiter
	// took slots again: they count against the cap.
	if n, err := closed.InUse(context.Background(), "acme"); n != 2 || err != nil {
		t.Errorf("InUse after recovery = %d, %v; want the 2 fail-open grants still held", n, err)
	}
	for _, s := range grants {
		s.Release()
	}
	// Redis kept its data across the stop (it saves on shutdown): the
	// releases made during the outage are retried, not left to expire.
	assertNothingHeld(t, rdb, prefix, 20*time.Second, open, closed)
	for _, l := range []*Limiter{open, closed} {
		s := mustAcquire(t, l, "acme", 2)
		defer s.Release()
	}
	if _, err := open.AcquireSlot(context.Background(), "acme", 2, 0); !isOverLimit(err) {
		t.Errorf("after recovery, the cap holds again: err = %v, want ErrOverLimit", err)
	}
}

// TestRedisSlowRedisTimesOut pauses Redis: calls hang rather than fail. A
// request must still be answered within OpTimeout, although the client's
// own timeouts are far longer, and the take it gave up on (which Redis runs
// when it resumes) must be released, not leaked.
func TestRedisSlowRedisTimesOut(t *testing.T) {
	r := tenantdbtest.StartRedis(t)
	prefix := uniquePrefix(t)
	slowClient := redis.NewClient(&redis.Options{Addr: r.Addr, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = slowClient.Close() })
	const opTimeout = 200 * time.Millisecond
	l := newLimiter(t, Config{Client: slowClient, Prefix: prefix, LeaseTTL: 2 * time.Minute,
		OpTimeout: opTimeout, RecheckEvery: 100 * time.Millisecond})
	held := mustAcquire(t, l, "acme", 5)

	if err := r.Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	// If the test fails while Redis is paused: unpause before the limiter's
	// Close (cleanups run last-registered first), or Close waits out the
	// client's minute-long timeouts on every call still in flight.
	t.Cleanup(func() { _ = r.Unpause(context.Background()) })
	start := time.Now()
	s, err := l.AcquireSlot(context.Background(), "acme", 5, 0)
	took := time.Since(start)
	if err != nil || !s.Local() {
		t.Fatalf("Redis paused: lease %v, err %v; want a local lease", s, err)
	}
	// Generous: far below the client's minute, but OpTimeout is the bound.
	if took > 30*opTimeout {
		t.Errorf("answered after %v with OpTimeout %v", took, opTimeout)
	}
	s.Release()
	held.Release()
	if st := l.Stats(); st.Healthy || st.Errors == 0 {
		t.Errorf("stats while paused: %+v, want degraded with errors", st)
	}
	if err := r.Unpause(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "healthy again", func() bool { return l.Stats().Healthy })
	rdb := newClient(t, r.Addr)
	// Well within the two-minute TTL: released, not expired.
	assertNothingHeld(t, rdb, prefix, 30*time.Second, l)
	mustAcquire(t, l, "acme", 5).Release()
}

// TestRedisReleasedChannelUnsubscribedAfterReconnect drops the pub/sub
// connection while a released tenant's channel lingers. go-redis subscribes
// again on reconnect to every channel it tracks; the limiter must still
// unsubscribe that channel once its linger is over rather than forget it
// and leave it subscribed for the life of the Limiter.
func TestRedisReleasedChannelUnsubscribedAfterReconnect(t *testing.T) {
	r := tenantdbtest.StartRedis(t) // its own: the test kills every pub/sub client
	rdb := newClient(t, r.Addr)
	ctx := context.Background()
	l := newLimiter(t, Config{Client: newClient(t, r.Addr), LeaseTTL: 3 * time.Second, RenewEvery: 500 * time.Millisecond,
		OpTimeout: time.Second, RecheckEvery: 100 * time.Millisecond})
	slept := sleeping(l)
	channel := tenantKeys(l.cfg.Prefix, "acme").channel
	subscribed := func() bool {
		chans, err := rdb.PubSubChannels(ctx, channel).Result()
		if err != nil {
			t.Fatalf("PUBSUB CHANNELS: %v", err)
		}
		return len(chans) > 0
	}

	held := mustAcquire(t, l, "acme", 1)
	waiter := acquireAsync(l, "acme", 1, -1)
	awaitSleep(t, slept, "acme") // subscribed, and confirmed
	held.Release()
	if a := receive(t, waiter, "waiter"); a.err != nil {
		t.Fatalf("waiter: %v", a.err)
	} else {
		a.s.Release()
	}
	if !subscribed() {
		t.Fatal("the channel is not subscribed while it lingers")
	}

	if err := rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatalf("CLIENT KILL: %v", err)
	}
	eventually(t, time.Minute, "the pub/sub connection is back", func() bool {
		list, err := rdb.ClientList(ctx).Result()
		if err != nil {
			t.Fatalf("CLIENT LIST: %v", err)
		}
		return strings.Contains(list, "sub=1")
	})
	// The channel is unsubscribed by the first sweep after its linger:
	// within two lingers of the release. Four leave room for a slow machine.
	eventually(t, 4*l.n.linger, "the released channel is unsubscribed", func() bool {
		return !subscribed()
	})
}

// TestRedisRestartWithoutPersistenceCountsLostLeases restarts a Redis that
// keeps no data across restarts while two FailOpen processes each hold one
// slot of a cap of 2, and a third takes the cap on the empty Redis. What
// docs/cluster.md says the operator sees: each holder's next renewal finds
// its lease gone, counts it in LostLeases and puts it back under a new
// member, so Redis holds 4 leases for a cap of 2 until the requests end.
func TestRedisRestartWithoutPersistenceCountsLostLeases(t *testing.T) {
	r := tenantdbtest.StartRedis(t, tenantdbtest.WithRedisArgs("--save", "", "--appendonly", "no"))
	prefix := uniquePrefix(t)
	ctx := context.Background()
	cfg := func() Config {
		// LeaseTTL 30s: no renewal (every 10s) runs before the third
		// process has taken the cap on the restarted Redis.
		return Config{Client: newClient(t, r.Addr), Prefix: prefix, LeaseTTL: 30 * time.Second,
			OpTimeout: testOpTimeout, RecheckEvery: 100 * time.Millisecond}
	}
	a, b := newLimiter(t, cfg()), newLimiter(t, cfg())
	for _, l := range []*Limiter{a, b} {
		defer mustAcquire(t, l, "acme", 2).Release()
	}
	if err := r.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	c := newLimiter(t, cfg())
	for range 2 {
		defer mustAcquire(t, c, "acme", 2).Release()
	}
	for name, l := range map[string]*Limiter{"a": a, "b": b} {
		eventually(t, time.Minute, name+" finds its lease lost and puts it back", func() bool {
			st := l.Stats()
			return st.LostLeases == 1 && st.Held == 1 && st.LocalHeld == 0
		})
		t.Logf("%s: %+v", name, l.Stats())
	}
	if n, err := c.InUse(ctx, "acme"); n != 4 || err != nil {
		t.Errorf("InUse = %d, %v; want 4 for a cap of 2 until the requests end", n, err)
	}
}
