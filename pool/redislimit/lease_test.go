package redislimit

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// TestRedisSameProcessIDNeverExceedsCap gives two limiters (two pods with
// one host name, a copied config) the same ProcessID. Their lease members
// must still differ: with ProcessID#seq alone, each take of the second
// overwrote the first's member, and the pair held 6 slots of a cap of 3.
func TestRedisSameProcessIDNeverExceedsCap(t *testing.T) {
	addr := sharedRedis(t)
	prefix := uniquePrefix(t)
	a := newLimiter(t, Config{Client: newClient(t, addr), Prefix: prefix, ProcessID: "pod"})
	b := newLimiter(t, Config{Client: newClient(t, addr), Prefix: prefix, ProcessID: "pod"})
	const limit = 3
	held := 0
	for range limit {
		for _, l := range []*Limiter{a, b} {
			s, err := l.AcquireSlot(context.Background(), "acme", limit, 0)
			if err == nil {
				held++
				defer s.Release()
			} else if !isOverLimit(err) {
				t.Fatal(err)
			}
		}
	}
	if held != limit {
		t.Errorf("two limiters with one ProcessID held %d slots, cap %d", held, limit)
	}
	if n := zcard(t, a.client, a.SlotsKey("acme")); n != limit {
		t.Errorf("ZCARD = %d, want %d", n, limit)
	}
}

// TestRedisTakeNeverOverwritesMember runs the take script with a member that
// is already in the set: it must fail (DUPMEMBER, a script error) rather
// than merge two leases into one slot.
func TestRedisTakeNeverOverwritesMember(t *testing.T) {
	l := newLimiter(t, Config{})
	k := tenantKeys(l.cfg.Prefix, "acme")
	args := []any{"m", 5, l.leaseTTL, l.keyTTL, modeTry, l.markTTL, k.channel}
	if r, err := parseTake(takeScript.Run(context.Background(), l.client, []string{k.slots, k.waiting}, args...)); err != nil || !r.took {
		t.Fatalf("first take: %+v, %v", r, err)
	}
	_, err := parseTake(takeScript.Run(context.Background(), l.client, []string{k.slots, k.waiting}, args...))
	if err == nil || !strings.Contains(err.Error(), "DUPMEMBER") || classify(err) != ErrorScript {
		t.Fatalf("second take of the same member: err = %v (%v), want DUPMEMBER, a script error", err, classify(err))
	}
	if n := zcard(t, l.client, k.slots); n != 1 {
		t.Errorf("ZCARD = %d, want 1", n)
	}
}

// TestRedisLostLeaseRevokedInFailClosed: a renewal that finds a FailClosed
// lease gone closes its Revoked channel. In FailOpen the request runs on, so the lease
// is put back under a new member: Redis must count what runs.
func TestRedisLostLeaseRevokedInFailClosed(t *testing.T) {
	for _, mode := range []Mode{FailClosed, FailOpen} {
		t.Run(mode.String(), func(t *testing.T) {
			// RenewEvery finds the loss quickly; a LeaseTTL of 3s keeps a
			// slow call on a loaded machine from letting the lease expire
			// (ExpiredLeases, not LostLeases) or from degrading the limiter
			// at the first take (OpTimeout is LeaseTTL/4, at most 500ms).
			l := newLimiter(t, Config{Mode: mode, LeaseTTL: 3 * time.Second, RenewEvery: 100 * time.Millisecond})
			s := mustAcquire(t, l, "acme", 1).(*lease)
			if s.revoked() {
				t.Fatal("revoked at once")
			}
			l.mu.Lock()
			first := s.member
			l.mu.Unlock()
			if err := l.client.Del(context.Background(), l.SlotsKey("acme")).Err(); err != nil {
				t.Fatal(err)
			}
			if mode == FailClosed {
				select {
				case <-s.Revoked():
				case <-time.After(10 * time.Second):
					t.Fatal("Revoked not closed after the renewal found the lease gone")
				}
				if st := l.Stats(); st.RevokedLeases != 1 || st.LostLeases != 1 || st.Held != 0 || st.LocalHeld != 0 {
					t.Errorf("stats %+v, want 1 revoked, 1 lost, nothing held", st)
				}
			} else {
				eventually(t, 10*time.Second, "the lease is put back", func() bool {
					st := l.Stats()
					return st.LostLeases == 1 && st.Held == 1 && zcard(t, l.client, l.SlotsKey("acme")) == 1
				})
				l.mu.Lock()
				again := s.member
				l.mu.Unlock()
				if s.Revoked() != nil || s.Local() || again == first {
					t.Errorf("fail-open lease after loss: Revoked %v, Local %v, member %q (was %q)", s.Revoked(), s.Local(), again, first)
				}
				if st := l.Stats(); st.RevokedLeases != 0 || st.LocalHeld != 0 {
					t.Errorf("stats %+v, want none revoked, none local", st)
				}
			}
			s.Release()
			s.Release()
			assertNothingHeld(t, l.client, l.cfg.Prefix, 10*time.Second, l)
		})
	}
}

// TestRedisRecoveryAssertsFailOpenGrants: requests granted locally during an
// outage still run when Redis comes back. The limiter must put them in Redis
// before it takes slots again; otherwise another process, seeing the slots
// free, hands them out a second time.
func TestRedisRecoveryAssertsFailOpenGrants(t *testing.T) {
	r := tenantdbtest.StartRedis(t)
	prefix := uniquePrefix(t)
	cfg := Config{Client: newClient(t, r.Addr), Prefix: prefix, LeaseTTL: time.Minute,
		OpTimeout: 300 * time.Millisecond, RecheckEvery: 100 * time.Millisecond}
	open := newLimiter(t, cfg)
	cfg.Client = newClient(t, r.Addr)
	other := newLimiter(t, cfg)
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	var local []*lease
	for range 2 {
		s, err := open.AcquireSlot(context.Background(), "acme", 3, 0)
		if err != nil || !s.Local() {
			t.Fatalf("Redis down: lease %v, err %v; want a local lease", s, err)
		}
		local = append(local, s.(*lease))
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "healthy again", func() bool { return open.Stats().Healthy })
	// As soon as it is healthy, the grants are in Redis: 2 of 3 held.
	if n, err := open.InUse(context.Background(), "acme"); n != 2 || err != nil {
		t.Fatalf("InUse right after recovery = %d, %v; want the 2 grants still running", n, err)
	}
	for _, s := range local {
		if s.Local() {
			t.Error("an asserted grant still reports Local")
		}
	}
	st := open.Stats()
	if st.Reconciles != 1 || st.Held != 2 || st.LocalHeld != 0 {
		t.Errorf("stats after recovery %+v, want 1 reconcile, 2 held, 0 local", st)
	}
	eventually(t, 30*time.Second, "the other limiter healthy", func() bool {
		_, err := other.AcquireSlot(context.Background(), "acme", 3, 0)
		return err == nil || isOverLimit(err)
	})
	if _, err := other.AcquireSlot(context.Background(), "acme", 3, 0); !isOverLimit(err) {
		t.Errorf("another process after recovery: err = %v, want ErrOverLimit (3 of 3 held)", err)
	}
	for _, s := range local {
		s.Release()
	}
	other.Close() // releases its one slot
	assertNothingHeld(t, open.client, prefix, 10*time.Second, open)
}

// TestRedisPausedPastTTLRevokesOnTime pauses Redis (connections stay open,
// nothing answers) longer than the lease TTL, with a client that ignores
// context deadlines and would wait a minute on the socket. The FailClosed
// lease must be revoked when its local validity ends, not when Redis
// answers; and the renewals must not wait longer than OpTimeout each.
func TestRedisPausedPastTTLRevokesOnTime(t *testing.T) {
	r := tenantdbtest.StartRedis(t)
	slow := redis.NewClient(&redis.Options{Addr: r.Addr, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = slow.Close() })
	const ttl = time.Second
	l := newLimiter(t, Config{Client: slow, Mode: FailClosed, LeaseTTL: ttl, RenewEvery: 200 * time.Millisecond,
		OpTimeout: 100 * time.Millisecond, RecheckEvery: 100 * time.Millisecond})
	// The scenario starts with a lease held and a healthy limiter.
	s := leaseWhenUp(t, l, 1)
	eventually(t, 10*time.Second, "a renewal, healthy", func() bool {
		st := l.Stats()
		return st.Renewals > 0 && st.Healthy
	})
	if err := r.Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Unpause(context.Background()) }()
	paused := time.Now()
	eventually(t, 10*time.Second, "degraded", func() bool { return !l.Stats().Healthy })
	degradedAfter := time.Since(paused)
	select {
	case <-s.Revoked():
	case <-time.After(time.Minute):
		t.Fatal("the lease was not revoked while Redis hung")
	}
	revokedAfter := time.Since(paused)
	t.Logf("degraded after %v, revoked after %v (TTL %v)", degradedAfter, revokedAfter, ttl)
	// The lease was last confirmed at most RenewEvery+OpTimeout before the
	// pause; it is revoked within its validity of that, plus slack for
	// this machine, far before the client's minute.
	if revokedAfter > ttl+2*time.Second {
		t.Errorf("revoked %v after the pause, TTL %v", revokedAfter, ttl)
	}
	if st := l.Stats(); st.ExpiredLeases != 1 || st.RevokedLeases != 1 || st.ErrorsByKind[ErrorTimeout] == 0 {
		t.Errorf("stats %+v, want 1 expired and revoked, timeouts counted", st)
	}
	if err := r.Unpause(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "healthy again", func() bool { return l.Stats().Healthy })
	s.Release() // nothing to do: it was revoked
	assertNothingHeld(t, newClient(t, r.Addr), l.cfg.Prefix, 10*time.Second, l)
}

// TestRedisOOMDoesNotFlap fills a Redis whose maxmemory is tiny. Renewals
// fail with OOM while PING still answers: the limiter must stay degraded
// (its probe writes), not flap between healthy and degraded on every PING,
// and count the failures as OOM. It also checks CheckEviction on this
// server.
func TestRedisOOMDoesNotFlap(t *testing.T) {
	r := tenantdbtest.StartRedis(t)
	rdb := newClient(t, r.Addr)
	ctx := context.Background()
	l := newLimiter(t, Config{Client: newClient(t, r.Addr), LeaseTTL: time.Second, RecheckEvery: 20 * time.Millisecond})
	if err := l.CheckEviction(ctx); err != nil {
		t.Errorf("CheckEviction with noeviction: %v", err)
	}
	s := mustAcquire(t, l, "acme", 5)
	defer s.Release()

	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "degraded by an OOM renewal", func() bool {
		st := l.Stats()
		return !st.Healthy && st.ErrorsByKind[ErrorOOM] > 0
	})
	eventually(t, 10*time.Second, "ten failed probes", func() bool { return l.Stats().ErrorsByKind[ErrorOOM] >= 10 })
	if st := l.Stats(); st.Healthy || st.Degradations != 1 {
		t.Errorf("while OOM: %+v, want degraded once, not flapping", st)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "healthy again", func() bool { return l.Stats().Healthy })

	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.CheckEviction(ctx); !errors.Is(err, ErrEvictionPolicy) {
		t.Errorf("CheckEviction with allkeys-lru: err = %v, want ErrEvictionPolicy", err)
	}
}

// TestRedisClassifiesScriptErrors runs a script that fails in Redis.
func TestRedisClassifiesScriptErrors(t *testing.T) {
	rdb := newClient(t, sharedRedis(t))
	err := rdb.Eval(context.Background(), "return redis.call('NOSUCHCOMMAND')", nil).Err()
	if k := classify(err); k != ErrorScript {
		t.Errorf("classify(%v) = %v, want script", err, k)
	}
	if k := classify(errTimedOut); k != ErrorTimeout {
		t.Errorf("classify(errTimedOut) = %v", k)
	}
	bad := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer bad.Close()
	if err := bad.Ping(context.Background()).Err(); classify(err) != ErrorNetwork {
		t.Errorf("classify(%v) = %v, want network", err, classify(err))
	}
}

// TestRedisRevocationCountedBeforeDone: a holder that sees Done closed and
// reads Stats must find the revocation counted, with its reason (expired
// here). The counters were updated after Done closed, and
// TestRedisPausedPastTTLRevokesOnTime read ExpiredLeases 0 under load. Many
// leases expire at once, each watched by a goroutine, to give the old order
// chances to show; no Redis is needed (nothing answers at the address).
func TestRedisRevocationCountedBeforeDone(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	l := newLimiter(t, Config{Client: rdb, Mode: FailClosed, LeaseTTL: time.Minute})
	const n = 2000
	var leases []*lease
	l.mu.Lock()
	past := time.Now().Add(-time.Hour) // validity over: each expiry fires at once
	for range n {
		s := l.newLease("acme", l.newMember())
		l.holdLocked(s, past)
		leases = append(leases, s)
	}
	l.mu.Unlock()
	var wg sync.WaitGroup
	var seen, bad atomic.Uint64
	for _, s := range leases {
		wg.Go(func() {
			select {
			case <-s.Revoked():
			case <-time.After(time.Minute):
				t.Error("a lease past its validity was not revoked")
				return
			}
			// At least k Done channels are closed, so at least k
			// revocations must be counted.
			k := seen.Add(1)
			if st := l.Stats(); st.ExpiredLeases < k || st.RevokedLeases < k {
				bad.Add(1)
			}
		})
	}
	wg.Wait()
	if b := bad.Load(); b != 0 {
		t.Errorf("%d of %d holders saw Done closed before the revocation was counted", b, n)
	}
	if st := l.Stats(); st.ExpiredLeases != n || st.RevokedLeases != n {
		t.Errorf("stats %+v, want %d expired and revoked", st, n)
	}
}
