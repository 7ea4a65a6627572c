package pool

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Gate admits requests per tenant in front of a shared capacity. It is safe for
// concurrent use. Create it with New; the zero value is not usable.
type Gate struct {
	cfg           Config        // read-only after New; Plans is nil (see plans)
	releaseTracer ReleaseTracer // cfg.Tracer, if it implements ReleaseTracer
	epoch         time.Time
	clock         func() int64       // ns since epoch, monotonic; replaced in tests
	budgets       atomic.Bool        // whether a plan has or had a Budget: then a traced admission reports it
	runners       atomic.Bool        // whether a Runner was made on it: only then can a context be one of its jobs'
	closing       context.Context    // cancelled by Close, to end the requests asking the cluster
	stopClosing   context.CancelFunc // cancels closing

	mu            sync.Mutex
	closed        bool                  // guarded by mu
	used          int                   // guarded by mu: permits granted, all tenants
	waiting       int                   // guarded by mu: requests waiting, all tenants
	tenants       map[string]*tenant    // guarded by mu
	recent        *tenant               // guarded by mu: the last tenant admitted, so a run of its requests skips the map
	tenantsPeak   int                   // guarded by mu: most tenants tracked since the map was last rebuilt
	plans         map[string]*planState // guarded by mu: the plans in force (Config.Plans, then SetPlan)
	defaultPlan   *planState            // guarded by mu
	overrides     map[string]int        // guarded by mu: SetTenantLimit values
	failed        failedLookups         // guarded by mu: recent Lookup failures
	classes       []*classState         // the default class, then Config.Classes by name; fixed after New
	servers       map[string]*placed    // the servers' stages by name (one, "", without Config.Servers); fixed after New
	serverList    []*shared             // the same, by name; fixed after New
	fresh, idle   list[tenant]          // guarded by mu
	freePermits   *permitState          // guarded by mu: released permit states, for reuse
	sampleTick    uint32                // guarded by mu
	sampler       uint64                // guarded by mu: budgets' random sampling of holds (sampleRandLocked)
	lastNow       int64                 // guarded by mu: latest clock reading
	totals        counters              // guarded by mu
	evicted       uint64                // guarded by mu
	resDenied     uint64                // guarded by mu
	clusterLocal  uint64                // guarded by mu
	clusterErrors uint64                // guarded by mu
}

// New validates cfg and returns a Gate. A configuration that cannot work (a
// plan's cap or reservation above the capacity, a class's cap above a plan's,
// a malformed class name, negative numbers, an unknown default plan) is an
// error wrapping ErrInvalidConfig.
func New(cfg Config) (*Gate, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	classes, err := newClasses(&cfg)
	if err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(mapKeys(cfg.Plans)) {
		if err := validateClassConns(name, cfg.Plans[name], classes); err != nil {
			return nil, err
		}
	}
	g := &Gate{
		cfg:       cfg,
		epoch:     time.Now(),
		tenants:   make(map[string]*tenant),
		plans:     make(map[string]*planState, len(cfg.Plans)),
		overrides: make(map[string]int),
		classes:   classes,
	}
	g.clock = func() int64 { return int64(time.Since(g.epoch)) + 1 } // never 0: 0 means "not measured"
	g.sampler = rand.Uint64() | 1                                    // xorshift needs a state other than 0

	g.closing, g.stopClosing = context.WithCancel(context.Background())
	g.releaseTracer, _ = cfg.Tracer.(ReleaseTracer)
	for name, p := range cfg.Plans {
		g.plans[name] = newPlanState(name, p, classes)
		if p.Budget.Rate > 0 {
			g.budgets.Store(true)
		}
	}
	for _, c := range classes {
		if c.Budget.Rate > 0 {
			g.budgets.Store(true)
		}
	}
	g.servers = newServers(&g.cfg, classes)
	for _, name := range slices.Sorted(mapKeys(g.servers)) {
		g.serverList = append(g.serverList, g.servers[name].srv)
	}
	g.defaultPlan = g.plans[cfg.DefaultPlan]
	g.cfg.Plans = nil // g.plans is the truth from here on
	return g, nil
}

// Capacity returns the global capacity.
func (g *Gate) Capacity() int { return g.cfg.Capacity }

// Close fails every waiting request with ErrClosed and makes later Acquire
// calls fail with it. Permits already granted stay valid; releasing them is
// still safe.
func (g *Gate) Close() {
	var leases []ClusterLease
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		leases = g.failWaitersLocked()
	}
	g.mu.Unlock()
	g.stopClosing() // ends the waits of requests asking the cluster
	for _, l := range leases {
		defer l.Release() // deferred: one that panics does not keep the others
	}
}

// failWaitersLocked fails every request in a queue with ErrClosed, and
// returns the cluster leases they held, to release once unlocked. Requests
// asking the cluster see the Gate closed when they come back.
func (g *Gate) failWaitersLocked() (leases []ClusterLease) {
	now := g.nowLocked()
	for _, t := range g.tenants {
		c := t.wait
		if c == nil {
			continue
		}
		for i := range c.lanes {
			l := &c.lanes[i]
			for _, q := range []*list[waiter]{&l.capQ, &l.globalQ} {
				for w := q.popFront(); w != nil; w = q.popFront() {
					if w.lease != nil {
						leases = append(leases, w.lease)
						w.lease = nil
					}
					g.waiting--
					l.class.waiting--
					w.endLocked(Failed, ErrClosed, now)
				}
			}
		}
		g.fixLinesLocked(t)
		if t.isIdle() {
			g.markIdleLocked(t, now)
		}
	}
	return leases
}

// Acquire waits for a permit for tenantID and returns it, or an error:
//   - ErrInvalidTenant (wrapped) for an empty, over-long or malformed ID;
//   - an *OverLimitError (errors.Is ErrOverLimit) when the tenant is at its
//     cap and its plan's queue is full, or it waited the plan's MaxWait;
//   - ctx's error (wrapped) when ctx ends first, errors.Is(err,
//     context.DeadlineExceeded) for a deadline;
//   - a Lookup error, ErrUnknownPlan, ErrUnknownClass, ErrTooManyTenants or
//     ErrClosed (wrapped).
//
// The request is of the class ctx carries (WithClass), the default class
// without one. ctx governs the whole admission: the Lookup, the wait for the tenant's cap
// and the wait for global capacity. A request that fails holds nothing.
func (g *Gate) Acquire(ctx context.Context, tenantID string) (Permit, error) {
	tracer := g.cfg.Tracer
	if tracer == nil {
		var d TraceAcquireEndData
		return g.acquire(ctx, tenantID, &d)
	}
	tctx := tracer.TraceAcquireStart(ctx, g, TraceAcquireStartData{Tenant: tenantID})
	d := TraceAcquireEndData{Tenant: tenantID}
	p, err := g.acquire(ctx, tenantID, &d)
	if p.s != nil {
		p.s.ctx = tctx // only this goroutine knows p yet
	}
	if d.Plan != "" && g.budgets.Load() {
		g.traceBudget(&d)
	}
	d.Err = err
	ended := false
	defer func() {
		if !ended {
			p.Release() // TraceAcquireEnd panicked: nobody will ever hold p
		}
	}()
	tracer.TraceAcquireEnd(tctx, g, d)
	ended = true
	return p, err
}

const (
	holdSampleEvery = 16
	// sweepBudget bounds the idle tenants looked at per sweep, to keep the
	// work under the lock O(1).
	sweepBudget = 16
)

// adminBatch is how many tenants an administrative operation (SetPlan,
// EvictIdle, AppendTenantStat) handles per hold of the lock, so that after a
// flood of tenants admissions still get the lock between batches.
const adminBatch = 1024

// Test hooks. grantHook, when set, is called under the lock before every
// grant, to check invariants at the moment they matter; adminBatchHook between
// the batches of an administrative operation, unlocked; wakeIgnoredHook when a
// waiter woke to a signal that changed nothing for it.
var (
	grantHook                       func(g *Gate, t *tenant, c *classState)
	adminBatchHook, wakeIgnoredHook func()
)

// nowLocked reads the clock and remembers the reading.
func (g *Gate) nowLocked() int64 {
	now := g.clock()
	if now > g.lastNow {
		g.lastNow = now
	}
	return g.lastNow
}
