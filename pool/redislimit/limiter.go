package redislimit

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool"
)

// Limiter keeps tenants' caps across processes in Redis. It implements
// pool.ClusterLimiter and is safe for concurrent use. Create it with New
// and stop it with Close.
type Limiter struct {
	cfg    Config // read-only after New
	client redis.UniversalClient
	log    *slog.Logger
	n      *notifier

	// Script arguments that never change, in milliseconds.
	leaseTTL, keyTTL, markTTL string

	// sleepHook, when set (by tests, before use), is called when a waiter
	// goes to sleep until notified, its subscription confirmed.
	sleepHook func(tenant string)

	// instance is random per Limiter and in every lease member it writes,
	// so that two limiters given the same ProcessID (a copied config, pods
	// sharing a host name) never write the same member: ZADD would merge
	// their leases into one and let the tenant exceed its cap.
	instance string
	// validity is how long after a confirmed take or renewal was sent a
	// lease is surely still in Redis: LeaseTTL less margin.
	validity time.Duration

	healthy atomic.Bool   // false while degraded
	seq     atomic.Uint64 // lease members
	bgBusy  atomic.Bool   // a background call is still running (see background)
	c       counters

	kick   chan struct{}      // wakes maintain
	done   chan struct{}      // closed by Close
	ctx    context.Context    // base of every Redis call; canceled by Close
	cancel context.CancelFunc // cancels ctx
	wg     sync.WaitGroup     // goroutines and AcquireSlot calls, for Close

	mu       sync.Mutex
	closed   bool                           // guarded by mu
	held     map[string]map[*lease]struct{} // guarded by mu: leases in Redis, by tenant
	locals   map[*lease]struct{}            // guarded by mu: local leases (FailOpen) not yet released
	nheld    int                            // guarded by mu: Σ len(held)
	pending  map[string][]pendingRelease    // guarded by mu: released, not yet removed from Redis
	npending int                            // guarded by mu: Σ len(pending)
	// flushing is the releases a flush is sending (maintain moved them out
	// of pending); a take of the same tenant carries them too, so that it
	// never counts a slot this process has released. Removing a member
	// twice is harmless.
	flushing  map[string][]pendingRelease // guarded by mu
	nflushing int                         // guarded by mu: Σ len(flushing)
}

var _ pool.ClusterLimiter = (*Limiter)(nil)

// New validates cfg and starts a Limiter: a goroutine that renews leases and
// flushes releases, and two that keep the pub/sub subscription for waiters.
// It does no I/O; the first request finds out whether Redis answers. A
// configuration that cannot work is an error wrapping ErrInvalidConfig.
func New(cfg Config) (*Limiter, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ms := func(d time.Duration) string { return strconv.FormatInt(max(1, d.Milliseconds()), 10) }
	l := &Limiter{
		cfg:      cfg,
		client:   cfg.Client,
		log:      cfg.Logger,
		leaseTTL: ms(cfg.LeaseTTL),
		// A key outlives every lease in it: each script that extends a
		// lease also extends the key.
		keyTTL: ms(2 * cfg.LeaseTTL),
		// Waiters refresh the mark at least every RecheckEvery; it must
		// not lapse between two of their attempts.
		markTTL:  ms(3*cfg.RecheckEvery + cfg.OpTimeout),
		kick:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		held:     make(map[string]map[*lease]struct{}),
		locals:   make(map[*lease]struct{}),
		instance: randomHex(4),
		validity: cfg.LeaseTTL - margin(cfg),
		pending:  make(map[string][]pendingRelease),
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.healthy.Store(true)
	l.n = newNotifier(l)
	l.wg.Add(3)
	go l.maintain()
	go l.n.receive()
	go l.n.control()
	return l, nil
}

// margin is how much earlier than Redis a process considers a lease
// expired: clocks run at slightly different rates, timers fire late, and
// the holder needs time to stop its work (tenantdb cancels the query) before
// another process may take the slot. A tenth of LeaseTTL; New makes sure a
// renewal fits in what is left (see Config.RenewEvery).
func margin(c Config) time.Duration {
	return c.LeaseTTL / 10
}

// newMember returns a lease member unique across limiters and processes.
func (l *Limiter) newMember() string {
	return l.cfg.ProcessID + "#" + l.instance + "." + strconv.FormatUint(l.seq.Add(1), 36)
}

// newLease returns a lease of tenant held in Redis as member.
func (l *Limiter) newLease(tenant, member string) *lease {
	s := &lease{l: l, tenant: tenant, member: member}
	if l.cfg.Mode == FailClosed {
		s.done = make(chan struct{})
	}
	return s
}

// SlotsKey returns the key of tenant's sorted set of leases, for operators:
// its members name the processes holding the slots
// (ProcessID#instance.n, instance being random per Limiter), scored by
// when each lease expires, in Unix milliseconds on Redis's clock. ZCARD of
// it also counts leases that expired and that no take has removed yet; see
// InUse.
func (l *Limiter) SlotsKey(tenant string) string { return tenantKeys(l.cfg.Prefix, tenant).slots }

// InUse returns how many of tenant's cluster slots are held, by all
// processes: the leases that have not expired. ctx governs the call, which
// OpTimeout also bounds.
func (l *Limiter) InUse(ctx context.Context, tenant string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	cmd, rt := l.run(ctx, inUseScript, false, []string{l.SlotsKey(tenant)})
	l.c.roundTrips.Add(uint64(rt))
	n, err := cmd.Int()
	if err != nil {
		return 0, fmt.Errorf("redislimit: tenant %q: count slots in use: %w", tenant, err)
	}
	return n, nil
}

// noteFailure counts a failed Redis call, by kind, and marks the limiter
// degraded.
func (l *Limiter) noteFailure(err error) {
	kind := classify(err)
	l.c.errors.Add(1)
	l.c.byKind[kind].Add(1)
	if l.healthy.CompareAndSwap(true, false) {
		l.c.degradations.Add(1)
		l.kickMaintenance() // to schedule its first attempt to reconcile
		level, msg := slog.LevelWarn, "redislimit: redis unavailable; requests follow the failure mode until a probe succeeds"
		switch kind {
		case ErrorScript:
			level, msg = slog.LevelError, "redislimit: redis cannot run the limiter's scripts; requests follow the failure mode"
		case ErrorOOM:
			msg = "redislimit: redis refuses writes (maxmemory reached); requests follow the failure mode until a probe succeeds"
		}
		l.log.Log(context.Background(), level, msg, "mode", l.cfg.Mode.String(), "kind", kind.String(), "err", err)
	}
}

func (l *Limiter) kickMaintenance() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Close stops the limiter: requests waiting for a slot get ErrClosed, the
// background goroutines stop, and the leases still held (and releases not
// yet flushed) are released in one round trip, best effort: what fails
// expires by LeaseTTL. Releasing a lease after Close does nothing. Close it
// after the pools that use it. It does not close Config.Client.
//
// Close waits for the Redis calls still in flight. Close cancels their
// context, but a client without ContextTimeoutEnabled keeps waiting on a
// Redis that does not answer (paused, partitioned) until its ReadTimeout, so
// Close can take that long; with ReadTimeout -1 (none) it would never return.
func (l *Limiter) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.mu.Unlock()
	close(l.done)
	l.cancel()
	l.n.close()
	l.wg.Wait()

	l.mu.Lock()
	rel := l.pending
	for tenant, set := range l.held {
		for s := range set {
			s.expiry.Stop()
			rel[tenant] = append(rel[tenant], pendingRelease{member: s.member})
		}
	}
	l.held, l.nheld = map[string]map[*lease]struct{}{}, 0
	l.pending, l.npending = map[string][]pendingRelease{}, 0
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.OpTimeout)
	defer cancel()
	_, _ = l.releaseInRedis(ctx, rel, time.Time{})
}
