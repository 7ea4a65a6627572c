package redislimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool"
)

func TestRedisTakeAndRelease(t *testing.T) {
	l := newLimiter(t, Config{})
	rdb := newClient(t, sharedRedis(t))
	ctx := context.Background()

	var held []pool.ClusterLease
	for range 3 {
		held = append(held, mustAcquire(t, l, "acme", 3))
	}
	if n := zcard(t, rdb, l.SlotsKey("acme")); n != 3 {
		t.Fatalf("ZCARD after 3 takes = %d, want 3", n)
	}
	if n, err := l.InUse(ctx, "acme"); n != 3 || err != nil {
		t.Fatalf("InUse after 3 takes = %d, %v; want 3", n, err)
	}
	if _, err := l.AcquireSlot(ctx, "acme", 3, 0); !isOverLimit(err) {
		t.Fatalf("4th take of 3: err = %v, want ErrOverLimit", err)
	}
	other := mustAcquire(t, l, "globex", 1) // tenants do not share slots

	// A release is seen by the next take of the same process at once,
	// whether or not the background flush has run yet.
	held[0].Release()
	held[0].Release() // idempotent
	held[0] = mustAcquire(t, l, "acme", 3)
	if n := zcard(t, rdb, l.SlotsKey("acme")); n != 3 {
		t.Fatalf("ZCARD after release and take = %d, want 3", n)
	}

	for _, s := range held {
		s.Release()
	}
	other.Release()
	t0 := time.Now()
	defer func() { t.Logf("nothing held after %v", time.Since(t0)) }()
	assertNothingHeld(t, rdb, l.cfg.Prefix, 10*time.Second, l)
	if keys := keysOf(t, rdb, l.cfg.Prefix); len(keys) != 0 {
		t.Errorf("keys left after every lease was released: %v", keys)
	}
	s := l.Stats()
	if s.Acquired != 5 || s.Rejected != 1 || s.Errors != 0 || !s.Healthy || s.Mode != FailOpen {
		t.Errorf("stats = %+v, want 5 acquired, 1 rejected, no errors, healthy, fail-open", s)
	}
}

func TestRedisLimitersShareTheCap(t *testing.T) {
	addr := sharedRedis(t)
	prefix := uniquePrefix(t)
	a := newLimiter(t, Config{Client: newClient(t, addr), Prefix: prefix})
	b := newLimiter(t, Config{Client: newClient(t, addr), Prefix: prefix})
	s1 := mustAcquire(t, a, "acme", 2)
	s2 := mustAcquire(t, b, "acme", 2)
	if _, err := a.AcquireSlot(context.Background(), "acme", 2, 0); !isOverLimit(err) {
		t.Fatalf("3rd take of 2 across two limiters: err = %v, want ErrOverLimit", err)
	}
	// Another prefix is another deployment.
	c := newLimiter(t, Config{Client: newClient(t, addr)})
	mustAcquire(t, c, "acme", 2).Release()
	s1.Release()
	s2.Release()
	assertNothingHeld(t, c.client, prefix, 10*time.Second, a, b, c)
}

// TestRedisWaiterWokenByNotification checks that a waiter in one process is
// woken by a release in another through pub/sub: the re-check interval and
// the lease TTL are far longer than the test, so nothing else could wake
// it, and it makes a handful of round trips however long it waits.
func TestRedisWaiterWokenByNotification(t *testing.T) {
	addr := sharedRedis(t)
	prefix := uniquePrefix(t)
	slow := Config{Prefix: prefix, LeaseTTL: time.Hour, RecheckEvery: 10 * time.Minute}
	holderCfg, waiterCfg := slow, slow
	holderCfg.Client, waiterCfg.Client = newClient(t, addr), newClient(t, addr)
	holder, waiter := newLimiter(t, holderCfg), newLimiter(t, waiterCfg)
	asleep := sleeping(waiter)

	s := mustAcquire(t, holder, "acme", 1)
	type result struct {
		s   pool.ClusterLease
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := waiter.AcquireSlot(context.Background(), "acme", 1, -1)
		done <- result{s, err}
	}()
	// Probe: the waiter has failed its attempt and its subscription is
	// confirmed, so it now sleeps until notified.
	// The waiter has made its fresh attempt, subscribed, made another
	// attempt once the subscription was confirmed, and sleeps.
	awaitSleep(t, asleep, "acme")
	before := waiter.Stats().RoundTrips
	time.Sleep(200 * time.Millisecond) // the scenario: a while holding, in which polling would show
	if rt := waiter.Stats().RoundTrips; rt != before {
		t.Errorf("the waiter made %d round trips while it waited: it polls", rt-before)
	}
	s.Release()
	var got result
	select {
	case got = <-done:
		if got.err != nil || got.s.Local() {
			t.Fatalf("waiter: lease %v, err %v", got.s, got.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiter was not woken by the release")
	}
	st := waiter.Stats()
	got.s.Release()
	if st.Wakeups < 1 {
		t.Errorf("Wakeups = %d, want at least 1", st.Wakeups)
	}
	// The three round trips above and the take after the wake-up.
	if st.RoundTrips != 4 {
		t.Errorf("the waiter made %d round trips, want 4", st.RoundTrips)
	}
	assertNothingHeld(t, holder.client, prefix, 10*time.Second, holder, waiter)
}

func TestRedisWaitEndsWithMaxWaitOrContext(t *testing.T) {
	l := newLimiter(t, Config{RecheckEvery: 20 * time.Millisecond})
	s := mustAcquire(t, l, "acme", 1)
	defer s.Release()

	_, err := l.AcquireSlot(context.Background(), "acme", 1, 30*time.Millisecond)
	if !isOverLimit(err) || !strings.Contains(err.Error(), "after waiting") {
		t.Errorf("maxWait ran out: err = %v, want ErrOverLimit after waiting", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := l.AcquireSlot(ctx, "acme", 1, -1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ctx deadline: err = %v, want context.DeadlineExceeded", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		eventually(t, 10*time.Second, "a third wait", func() bool { return l.Stats().Waited == 3 })
		cancel()
	}()
	if _, err := l.AcquireSlot(ctx, "acme", 1, -1); !errors.Is(err, context.Canceled) {
		t.Errorf("ctx canceled: err = %v, want context.Canceled", err)
	}
	if st := l.Stats(); st.Rejected != 1 || st.Waited != 3 {
		t.Errorf("stats = %+v, want 1 rejected, 3 waited", st)
	}
}

// TestRedisCrashedProcessSlotsExpire checks that the slots of a process that
// stopped renewing come back within the lease TTL, and that a waiter finds
// them without a notification (none is sent) and without waiting for its
// re-check (far longer): it sleeps until the soonest lease expires.
func TestRedisCrashedProcessSlotsExpire(t *testing.T) {
	addr := sharedRedis(t)
	prefix := uniquePrefix(t)
	const ttl = time.Second
	dead := newLimiter(t, Config{Client: newClient(t, addr), Prefix: prefix, LeaseTTL: ttl})
	// Its own LeaseTTL is long enough for a re-check this rare (see Config.RecheckEvery).
	live := newLimiter(t, Config{Client: newClient(t, addr), Prefix: prefix, LeaseTTL: time.Hour, RecheckEvery: 10 * time.Minute})
	mustAcquire(t, dead, "acme", 2)
	mustAcquire(t, dead, "acme", 2)
	crash(dead)
	crashed := time.Now()

	if _, err := live.AcquireSlot(context.Background(), "acme", 2, 0); !isOverLimit(err) {
		t.Fatalf("right after the crash: err = %v, want ErrOverLimit (the slots are still leased)", err)
	}
	if n, err := live.InUse(context.Background(), "acme"); n != 2 || err != nil {
		t.Fatalf("InUse right after the crash = %d, %v; want 2", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []pool.ClusterLease
	for range 2 {
		s, err := live.AcquireSlot(ctx, "acme", 2, -1)
		if err != nil {
			t.Fatalf("waiting for the dead process's slots: %v", err)
		}
		got = append(got, s)
	}
	// Bound: the lease TTL after the last renewal, which was at most
	// RenewEvery before the crash, plus generous slack for this machine.
	if took, bound := time.Since(crashed), ttl+2*time.Second; took > bound {
		t.Errorf("the slots came back after %v, want within %v", took, bound)
	}
	for _, s := range got {
		s.Release()
	}
	assertNothingHeld(t, live.client, prefix, 10*time.Second, live)
}

func TestRedisRenewalKeepsLeases(t *testing.T) {
	addr := sharedRedis(t)
	prefix := uniquePrefix(t)
	// Long enough that OpTimeout (LeaseTTL/4, at most 500ms) is not missed
	// by a slow call on a loaded machine: the other process's take would
	// then get a local lease (FailOpen), not ErrOverLimit.
	const ttl = 2 * time.Second
	holder := newLimiter(t, Config{Client: newClient(t, addr), Prefix: prefix, LeaseTTL: ttl, RenewEvery: 150 * time.Millisecond})
	other := newLimiter(t, Config{Client: newClient(t, addr), Prefix: prefix, LeaseTTL: ttl})
	s := mustAcquire(t, holder, "acme", 1)
	start := time.Now()
	// Hold for several TTLs; the slot must stay taken all along.
	eventually(t, time.Minute, "ten renewals and three TTLs", func() bool {
		if _, err := other.AcquireSlot(context.Background(), "acme", 1, 0); !isOverLimit(err) {
			t.Fatalf("after %v of holding: another process's take: err = %v, want ErrOverLimit", time.Since(start), err)
		}
		return holder.Stats().Renewals >= 10 && time.Since(start) > 3*ttl
	})
	if st := holder.Stats(); st.LostLeases != 0 || st.Held != 1 {
		t.Errorf("stats = %+v, want 1 held, none lost", st)
	}
	s.Release()
	// Another process sees the release once it is flushed; it waits for it.
	got, err := other.AcquireSlot(context.Background(), "acme", 1, 10*time.Second)
	if err != nil {
		t.Fatalf("after the release: %v", err)
	}
	got.Release()
	assertNothingHeld(t, holder.client, prefix, 10*time.Second, holder, other)
}

// TestRedisLostLeaseCounted simulates Redis losing its data (a restart
// without persistence): the renewal finds the lease gone, counts it, and
// (in FailClosed) does not bring it back.
func TestRedisLostLeaseCounted(t *testing.T) {
	// RenewEvery is what makes the test quick; LeaseTTL only sets OpTimeout
	// (LeaseTTL/4, at most 500ms), which must not make a slow call on a
	// loaded machine a failure: FailClosed then refuses the take below.
	l := newLimiter(t, Config{Mode: FailClosed, LeaseTTL: 3 * time.Second, RenewEvery: 100 * time.Millisecond})
	s := mustAcquire(t, l, "acme", 1)
	if err := l.client.Del(context.Background(), l.SlotsKey("acme")).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the renewal notices the lost lease", func() bool { return l.Stats().LostLeases == 1 })
	if st := l.Stats(); st.Held != 0 {
		t.Errorf("Held = %d after the lease was lost, want 0", st.Held)
	}
	if n := zcard(t, l.client, l.SlotsKey("acme")); n != 0 {
		t.Errorf("the lost lease was re-added: ZCARD = %d", n)
	}
	s.Release() // nothing to do
	// A call that outlived OpTimeout on this busy machine leaves the
	// limiter degraded, refusing takes, until its next probe.
	eventually(t, 10*time.Second, "healthy", func() bool { return l.Stats().Healthy })
	mustAcquire(t, l, "acme", 1).Release()
	assertNothingHeld(t, l.client, l.cfg.Prefix, 10*time.Second, l)
}

func TestRedisCloseReleasesAndStopsWaiters(t *testing.T) {
	rdb := newClient(t, sharedRedis(t))
	prefix := uniquePrefix(t)
	l, err := New(Config{Client: rdb, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	s1 := mustAcquire(t, l, "acme", 2)
	mustAcquire(t, l, "acme", 2)
	s1.Release()
	errc := make(chan error, 1)
	go func() {
		_, err := l.AcquireSlot(context.Background(), "globex", 0, -1)
		errc <- err
	}()
	eventually(t, 10*time.Second, "the waiter waits", func() bool { return l.Stats().Waited == 1 })
	l.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) || !errors.Is(err, pool.ErrClosed) {
			t.Errorf("waiter at Close: err = %v, want ErrClosed matching pool.ErrClosed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiter was not answered after Close")
	}
	// Close released what was held and what was pending, synchronously.
	if n := zcard(t, rdb, l.SlotsKey("acme")); n != 0 {
		t.Errorf("ZCARD after Close = %d, want 0", n)
	}
	if _, err := l.AcquireSlot(context.Background(), "acme", 2, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("AcquireSlot after Close: err = %v, want ErrClosed", err)
	}
	s1.Release()
	l.Close() // idempotent
}

// blockScripts is a client hook that holds every script call made outside a
// pipeline (a take) until its context ends, telling started when one begins.
type blockScripts struct{ started chan string }

func (blockScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h blockScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name != "evalsha" && name != "eval" {
			return next(ctx, cmd)
		}
		h.started <- cmd.Name()
		<-ctx.Done()
		cmd.SetErr(ctx.Err())
		return ctx.Err()
	}
}

func (blockScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRedisCloseDuringTakeAnswersErrClosed closes the limiter while a
// request's take is in flight, in both modes. Close cancels the take; the
// request must get ErrClosed, not be answered as if Redis had failed: that
// handed out a local lease (FailOpen) or ErrUnavailable (FailClosed) after
// Close, and made TestRedisCloseReleasesAndStopsWaiters flaky when Close
// caught its waiter re-checking.
func TestRedisCloseDuringTakeAnswersErrClosed(t *testing.T) {
	for _, mode := range []Mode{FailOpen, FailClosed} {
		for _, maxWait := range []time.Duration{0, -1} {
			t.Run(fmt.Sprintf("%v/maxWait=%v", mode, maxWait), func(t *testing.T) {
				c := newClient(t, sharedRedis(t))
				hook := blockScripts{started: make(chan string, 1)}
				c.AddHook(hook)
				// OpTimeout far longer than the test: only Close ends the take.
				l := newLimiter(t, Config{Client: c, Mode: mode, LeaseTTL: time.Hour, OpTimeout: 30 * time.Second})
				got := acquireAsync(l, "acme", 1, maxWait)
				select {
				case <-hook.started:
				case <-time.After(time.Minute):
					t.Fatal("no take started")
				}
				l.Close()
				a := receive(t, got, "request whose take Close interrupted")
				if !errors.Is(a.err, ErrClosed) {
					t.Errorf("Close during the take: lease %v, err %v; want ErrClosed", a.s, a.err)
				}
				if a.s != nil {
					a.s.Release()
				}
				if st := l.Stats(); st.FailOpenGrants != 0 || st.FailClosedErrors != 0 || st.Errors != 0 || st.LocalHeld != 0 {
					t.Errorf("stats %+v, want no failure counted: Redis did not fail", st)
				}
			})
		}
	}
}

// TestRedisConcurrentLimitersNeverExceedCap runs three limiters (as three
// processes would) with many goroutines each, with and without waiting, and
// checks the holders counted outside Redis against the cap at every take.
func TestRedisConcurrentLimitersNeverExceedCap(t *testing.T) {
	addr := sharedRedis(t)
	prefix := uniquePrefix(t)
	var ls []*Limiter
	for range 3 {
		ls = append(ls, newLimiter(t, Config{Client: newClient(t, addr), Prefix: prefix, RecheckEvery: 200 * time.Millisecond}))
	}
	const limit, perLimiter, rounds = 3, 8, 40
	tenants := []string{"acme", "globex"}
	var holders, peak [2]atomic.Int32
	var taken, rejected atomic.Int32
	var wg sync.WaitGroup
	for _, l := range ls {
		for g := range perLimiter {
			wg.Go(func() {
				for i := range rounds {
					ti := (g + i) % 2
					maxWait := []time.Duration{0, 20 * time.Millisecond, -1}[rand.IntN(3)]
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					s, err := l.AcquireSlot(ctx, tenants[ti], limit, maxWait)
					cancel()
					if err != nil {
						if !isOverLimit(err) && !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("AcquireSlot: %v", err)
						}
						rejected.Add(1)
						continue
					}
					if s.Local() {
						t.Errorf("local lease while Redis is up")
					}
					n := holders[ti].Add(1)
					for p := peak[ti].Load(); n > p && !peak[ti].CompareAndSwap(p, n); p = peak[ti].Load() {
					}
					if n > limit {
						t.Errorf("%d holders of %s, cap %d", n, tenants[ti], limit)
					}
					time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
					holders[ti].Add(-1)
					s.Release()
					taken.Add(1)
				}
			})
		}
	}
	wg.Wait()
	t.Logf("taken %d, rejected %d, peak holders %d and %d", taken.Load(), rejected.Load(), peak[0].Load(), peak[1].Load())
	if peak[0].Load() != limit || peak[1].Load() != limit {
		t.Errorf("peak holders %d, %d: the test did not fill the cap %d", peak[0].Load(), peak[1].Load(), limit)
	}
	assertNothingHeld(t, ls[0].client, prefix, 10*time.Second, ls...)
	for i, l := range ls {
		if st := l.Stats(); st.Errors != 0 || st.LostLeases != 0 {
			t.Errorf("limiter %d: stats %+v, want no errors or lost leases", i, st)
		}
	}
}

// TestRedisGatesShareClusterCap puts two pool.Gates (as two processes) in
// front of one Redis: each would let the tenant hold its plan's 3 permits,
// together they hold at most 3.
func TestRedisGatesShareClusterCap(t *testing.T) {
	addr := sharedRedis(t)
	prefix := uniquePrefix(t)
	var gates []*pool.Gate
	for range 2 {
		l := newLimiter(t, Config{Client: newClient(t, addr), Prefix: prefix})
		g, err := pool.New(pool.Config{
			Capacity: 10,
			Plans:    map[string]pool.Plan{"p": {MaxConns: 3, MaxWaiting: pool.Unbounded}},
			Cluster:  l,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		gates = append(gates, g)
	}
	var holders, peak atomic.Int32
	var wg sync.WaitGroup
	for _, g := range gates {
		for range 6 {
			wg.Go(func() {
				for range 15 {
					p, err := g.Acquire(context.Background(), "acme")
					if err != nil {
						t.Errorf("Acquire: %v", err)
						return
					}
					n := holders.Add(1)
					for q := peak.Load(); n > q && !peak.CompareAndSwap(q, n); q = peak.Load() {
					}
					time.Sleep(time.Millisecond)
					holders.Add(-1)
					p.Release()
				}
			})
		}
	}
	wg.Wait()
	if p := peak.Load(); p != 3 {
		t.Errorf("peak permits across both gates = %d, want exactly the cluster cap 3", p)
	}
	for i, g := range gates {
		if st := g.Stat(); st.ClusterLocal != 0 || st.ClusterErrors != 0 {
			t.Errorf("gate %d: ClusterLocal %d, ClusterErrors %d, want 0", i, st.ClusterLocal, st.ClusterErrors)
		}
	}
}

func TestRedisNewRejectsBadConfig(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	for name, cfg := range map[string]Config{
		"no client":         {},
		"ring":              {Client: ring},
		"negative TTL":      {Client: rdb, LeaseTTL: -1},
		"renew too slow":    {Client: rdb, LeaseTTL: time.Second, RenewEvery: time.Second},
		"timeout too long":  {Client: rdb, LeaseTTL: time.Second, OpTimeout: 800 * time.Millisecond},
		"unknown mode":      {Client: rdb, Mode: 7},
		"TTL below a tick":  {Client: rdb, LeaseTTL: time.Millisecond},
		"negative recheck:": {Client: rdb, RecheckEvery: -time.Second},
		// A probe a second after a failed renewal comes after the lease's
		// validity (900ms after the renewal before it, at 333ms) has ended.
		"recheck too long for the lease": {Client: rdb, LeaseTTL: time.Second, RecheckEvery: time.Second},
		// 333ms + 250ms + 320ms is just past the 900ms.
		"recheck just too long":        {Client: rdb, LeaseTTL: time.Second, RecheckEvery: 320 * time.Millisecond},
		"recheck of the default lease": {Client: rdb, RecheckEvery: 10 * time.Minute},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
	l, err := New(Config{Client: rdb})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := l.cfg
	if c.Prefix != "tenantdb" || c.LeaseTTL != 10*time.Second || c.RenewEvery != c.LeaseTTL/3 ||
		c.OpTimeout != 500*time.Millisecond || c.RecheckEvery != time.Second || c.Mode != FailOpen || c.ProcessID == "" {
		t.Errorf("defaults = %+v", c)
	}
	// The same condition's accepted side, and a default RecheckEvery that
	// a short lease leaves room for.
	for _, cfg := range []Config{
		{Client: rdb, LeaseTTL: time.Second, RecheckEvery: 300 * time.Millisecond},
		{Client: rdb, LeaseTTL: time.Second},
	} {
		l, err := New(cfg)
		if err != nil {
			t.Fatalf("New(LeaseTTL %v, RecheckEvery %v): %v", cfg.LeaseTTL, cfg.RecheckEvery, err)
		}
		c := l.cfg
		l.Close()
		if c.RenewEvery+c.OpTimeout+c.RecheckEvery >= l.validity || c.RecheckEvery <= 0 {
			t.Errorf("LeaseTTL %v: RecheckEvery %v leaves a lease to lapse while degraded (validity %v)", c.LeaseTTL, c.RecheckEvery, l.validity)
		}
	}
}

// TestNewLeavesRoomForADelayedRenewal: a due renewal may wait for the call
// then running (up to OpTimeout) and then for its own answer (up to
// OpTimeout), so New refuses a Config whose lease validity (LeaseTTL less
// a tenth) does not cover RenewEvery+2*OpTimeout. The first case was
// accepted with 25ms of slack, less than one slow flush.
func TestNewLeavesRoomForADelayedRenewal(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	ms := time.Millisecond
	for _, c := range []struct {
		renew, op time.Duration
		ok        bool
	}{
		{600 * ms, 350 * ms, false},
		{500 * ms, 200 * ms, false}, // 900ms: no slack at all
		{500 * ms, 199 * ms, true},
		{500 * ms, 0, false}, // the default OpTimeout, 250ms
		{0, 0, true},         // the defaults: 333ms + 2*250ms
		{0, 300 * ms, true},  // a long OpTimeout: the default RenewEvery leaves room for it (200ms)
		{0, 450 * ms, false}, // no room at all
	} {
		l, err := New(Config{Client: rdb, LeaseTTL: time.Second, RenewEvery: c.renew, OpTimeout: c.op})
		if !c.ok {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("RenewEvery %v, OpTimeout %v: err = %v, want ErrInvalidConfig", c.renew, c.op, err)
			}
			if l != nil {
				l.Close()
			}
			continue
		}
		if err != nil {
			t.Errorf("RenewEvery %v, OpTimeout %v: %v", c.renew, c.op, err)
			continue
		}
		if cfg := l.cfg; cfg.RenewEvery+2*cfg.OpTimeout >= l.validity {
			t.Errorf("RenewEvery %v, OpTimeout %v: a delayed renewal outlasts the validity %v", cfg.RenewEvery, cfg.OpTimeout, l.validity)
		}
		l.Close()
	}
}

// TestRedisStaleWaiterMarkDoesNotStall: the mark that tells new requests to
// queue behind waiters outlives the waiters for a while. A new request that
// finds it, and a free slot, must still get the slot without a
// notification (none will come) or a re-check (far longer than the test).
func TestRedisStaleWaiterMarkDoesNotStall(t *testing.T) {
	addr := sharedRedis(t)
	prefix := uniquePrefix(t)
	cfg := Config{Prefix: prefix, LeaseTTL: time.Hour, OpTimeout: testOpTimeout, RecheckEvery: 10 * time.Minute}
	cfg.Client = newClient(t, addr)
	a := newLimiter(t, cfg)
	cfg.Client = newClient(t, addr)
	b := newLimiter(t, cfg)
	s := mustAcquire(t, a, "acme", 1)
	if _, err := b.AcquireSlot(context.Background(), "acme", 1, 20*time.Millisecond); !isOverLimit(err) {
		t.Fatalf("err = %v, want ErrOverLimit after waiting", err)
	}
	s.Release()
	eventually(t, 10*time.Second, "the release reaches Redis", func() bool {
		n, err := b.InUse(context.Background(), "acme")
		return err == nil && n == 0
	})
	if n, _ := b.client.Exists(context.Background(), tenantKeys(prefix, "acme").waiting).Result(); n != 1 {
		t.Fatalf("the waiter mark is gone already; the test shows nothing")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := b.AcquireSlot(ctx, "acme", 1, -1)
	if err != nil {
		t.Fatalf("a free slot behind a stale mark: %v", err)
	}
	got.Release()
}

// TestRedisBusyProcessDoesNotStarveOthers: a process that releases a slot
// and at once takes it again (the release rides on its next take) must not
// keep the slot from another process's waiter forever: new requests queue
// behind marked waiters.
func TestRedisBusyProcessDoesNotStarveOthers(t *testing.T) {
	addr := sharedRedis(t)
	prefix := uniquePrefix(t)
	cfg := Config{Prefix: prefix, LeaseTTL: time.Hour, OpTimeout: testOpTimeout, RecheckEvery: 10 * time.Minute}
	cfg.Client = newClient(t, addr)
	busy := newLimiter(t, cfg)
	cfg.Client = newClient(t, addr)
	other := newLimiter(t, cfg)

	stop := make(chan struct{})
	var cycles atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				s, err := busy.AcquireSlot(ctx, "acme", 1, -1)
				cancel()
				if err != nil {
					continue
				}
				time.Sleep(time.Millisecond)
				s.Release()
				cycles.Add(1)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	eventually(t, 10*time.Second, "the busy process cycles", func() bool { return cycles.Load() > 20 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := cycles.Load()
	s, err := other.AcquireSlot(ctx, "acme", 1, -1)
	if err != nil {
		t.Fatalf("starved: %v after the busy process took the slot %d times", err, cycles.Load()-before)
	}
	n := cycles.Load() - before
	t.Logf("the other process got the slot after %d cycles of the busy one", n)
	// Without the queueing it takes hundreds: the busy process wins every
	// race its own release starts.
	if n > 100 {
		t.Errorf("the other process waited %d cycles of the busy one", n)
	}
	s.Release()
}

// slowPipelines is a client hook that answers every pipeline with an error
// after d, whatever its context says, telling started when one begins: a
// client without ContextTimeoutEnabled waiting on a slow Redis. No
// connection is made.
type slowPipelines struct {
	d       time.Duration
	started chan struct{}
}

func (slowPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (slowPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h slowPipelines) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(_ context.Context, cmds []redis.Cmder) error {
		select {
		case h.started <- struct{}{}:
		default:
		}
		time.Sleep(h.d)
		err := errors.New("slowPipelines: no answer")
		for _, c := range cmds {
			c.SetErr(err)
		}
		return err
	}
}

// TestRedisCloseDuringFlushIsNoFailure closes limiters while a flush is in
// flight and another is due. The call Close interrupts runs on; maintain
// must not then start the next one and count "the previous call is still
// running" as a failure of Redis (a degradation and its warning, logged by
// Close): the select in maintain picks at random among the ready cases.
func TestRedisCloseDuringFlushIsNoFailure(t *testing.T) {
	for i := range 20 {
		h := slowPipelines{d: 50 * time.Millisecond, started: make(chan struct{}, 1)}
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
		rdb.AddHook(h)
		l := newLimiter(t, Config{Client: rdb, LeaseTTL: time.Minute, OpTimeout: time.Second})
		l.mu.Lock()
		a, b := l.newLease("acme", l.newMember()), l.newLease("acme", l.newMember())
		l.holdLocked(a, time.Now())
		l.holdLocked(b, time.Now())
		l.mu.Unlock()
		a.Release() // kicks a flush
		<-h.started
		b.Release() // kicks the next
		l.Close()
		_ = rdb.Close()
		if st := l.Stats(); st.Degradations != 0 || st.Errors != 0 {
			t.Fatalf("limiter %d: closed during a flush: %d degradations, %d errors; want none", i, st.Degradations, st.Errors)
		}
	}
}
