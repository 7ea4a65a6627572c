package redislimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/internal/poll"
	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// shared is one Redis for the tests that do not stop it, started by the
// first test that needs it (so that `go test -run X` for another test
// starts none). Each test uses keys of its own prefix.
var shared struct {
	once sync.Once
	r    *tenantdbtest.Redis
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	// go test's -timeout stops counting when m.Run returns: a Docker call
	// that hangs here would hang the run with no test to blame. Bound them.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	if shared.r != nil {
		if err := shared.r.Terminate(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	if sharedCluster.c != nil {
		if err := sharedCluster.c.Terminate(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	cancel()
	if code == 0 {
		if err := tenantdbtest.FindLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// sharedRedis returns the shared server's address.
func sharedRedis(t testing.TB) string {
	t.Helper()
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared.r, shared.err = tenantdbtest.RunRedis(ctx)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.r.Addr
}

// newClient returns a client of addr, closed when t ends.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// uniquePrefix gives a test keys no other test touches.
func uniquePrefix(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return "test:" + name + ":" + hex.EncodeToString(b[:])
}

// testOpTimeout is the OpTimeout of tests that leave LeaseTTL, RenewEvery
// and OpTimeout to the defaults: tests about caps, waits and notifications,
// not about slow or missing answers. With the default 500ms a take slowed
// by this loaded machine (the race detector, other packages' containers
// starting) counts as a failure, and the limiter answers by its Mode: a
// local lease in FailOpen, which such tests rightly report as a broken cap.
// Tests about timeouts set OpTimeout themselves.
const testOpTimeout = 3 * time.Second

// newLimiter returns a started Limiter closed when t ends. cfg.Client
// defaults to a new client of the shared server, cfg.Prefix to a unique one,
// OpTimeout to testOpTimeout when the timings are all left to the defaults.
func newLimiter(t testing.TB, cfg Config) *Limiter {
	t.Helper()
	if cfg.LeaseTTL == 0 && cfg.RenewEvery == 0 && cfg.OpTimeout == 0 {
		cfg.OpTimeout = testOpTimeout
	}
	if cfg.Client == nil {
		cfg.Client = newClient(t, sharedRedis(t))
	}
	if cfg.Prefix == "" {
		cfg.Prefix = uniquePrefix(t)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(l.Close)
	return l
}

// crash makes l behave like a process that died: it forgets its leases
// (so Close does not release them) and stops renewing. Its keys stay in
// Redis until they expire.
func crash(l *Limiter) {
	l.mu.Lock()
	l.held, l.nheld = map[string]map[*lease]struct{}{}, 0
	l.pending, l.npending = map[string][]pendingRelease{}, 0
	l.mu.Unlock()
	l.Close()
}

// sleeping installs a sleepHook on l (before it is used) and returns a
// channel that receives the tenant of every waiter going to sleep until
// notified.
func sleeping(l *Limiter) <-chan string {
	c := make(chan string, 100)
	l.sleepHook = func(tenant string) { c <- tenant }
	return c
}

// awaitSleep waits until a waiter of tenant sleeps.
func awaitSleep(t testing.TB, c <-chan string, tenant string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case got := <-c:
			if got == tenant {
				return
			}
		case <-timeout:
			t.Fatalf("no waiter of %q went to sleep", tenant)
		}
	}
}

func mustAcquire(t testing.TB, l *Limiter, tenant string, limit int) pool.ClusterLease {
	t.Helper()
	s, err := l.AcquireSlot(context.Background(), tenant, limit, 0)
	if err != nil {
		t.Fatalf("AcquireSlot(%q, %d): %v", tenant, limit, err)
	}
	if s.Local() {
		t.Fatalf("AcquireSlot(%q): a local lease while Redis is up", tenant)
	}
	return s
}

func zcard(t testing.TB, c redis.UniversalClient, key string) int64 {
	t.Helper()
	n, err := c.ZCard(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("ZCARD %s: %v", key, err)
	}
	return n
}

// keysOf lists the keys of a prefix.
func keysOf(t testing.TB, c redis.UniversalClient, prefix string) []string {
	t.Helper()
	var all []string
	iter := c.Scan(context.Background(), 0, "{"+prefix+":*", 100).Iterator()
	for iter.Next(context.Background()) {
		all = append(all, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN: %v", err)
	}
	return all
}

// eventually polls cond every 2 ms until it holds, failing t after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, timeout, 2*time.Millisecond, what, cond)
}

// assertNothingHeld waits until no key of prefix holds a lease, and checks
// that the limiters hold and owe nothing.
func assertNothingHeld(t testing.TB, c redis.UniversalClient, prefix string, within time.Duration, ls ...*Limiter) {
	t.Helper()
	eventually(t, within, "no key of "+prefix+" holds a lease", func() bool {
		for _, k := range keysOf(t, c, prefix) {
			if strings.HasSuffix(k, ":slots") && zcard(t, c, k) != 0 {
				return false
			}
		}
		return true
	})
	for i, l := range ls {
		eventually(t, within, fmt.Sprintf("limiter %d holds and owes nothing", i), func() bool {
			s := l.Stats()
			return s.Held == 0 && s.LocalHeld == 0 && s.PendingReleases == 0
		})
	}
}

func isOverLimit(err error) bool { return errors.Is(err, pool.ErrOverLimit) }

// leaseWhenUp takes a lease of tenant "acme" under limit, trying again while
// the limiter refuses: on a loaded machine a take may miss a short OpTimeout
// (the first one dials and loads the script), and FailClosed then refuses
// until a probe succeeds.
func leaseWhenUp(t testing.TB, l *Limiter, limit int) *lease {
	t.Helper()
	var s *lease
	eventually(t, 30*time.Second, "a lease while Redis is up", func() bool {
		got, err := l.AcquireSlot(context.Background(), "acme", limit, 0)
		if err != nil {
			return false
		}
		s = got.(*lease)
		return true
	})
	return s
}

// validUntil is when s stops being valid, as l last renewed it.
func validUntil(l *Limiter, s *lease) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return s.validUntil
}
