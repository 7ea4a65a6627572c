package pool

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Gate admits requests per tenant in front of a shared capacity. It is safe for
// concurrent use. Create it with New; the zero value is not usable.
type Gate struct {
	cfg           Config // read-only after New, but for Plans (see plans)
	capacity      int
	tracer        AcquireTracer
	cluster       ClusterLimiter
	releaseTracer ReleaseTracer
	epoch         time.Time
	clock         func() int64       // ns since epoch, monotonic; replaced in tests
	closing       context.Context    // cancelled by Close, to end the requests asking the cluster
	stopClosing   context.CancelFunc // cancels closing

	mu            sync.Mutex
	closed        bool                  // guarded by mu
	used          int                   // guarded by mu: permits granted, all tenants
	waiting       int                   // guarded by mu: requests waiting, all tenants
	reservedFree  int                   // guarded by mu: Σ max(0, reserved-inUse) over tenants
	reservedTotal int                   // guarded by mu: Σ reserved over tenants
	tenants       map[string]*tenant    // guarded by mu
	tenantsPeak   int                   // guarded by mu: most tenants tracked since the map was last rebuilt
	plans         map[string]*planState // guarded by mu
	defaultPlan   *planState            // guarded by mu
	overrides     map[string]int        // guarded by mu: SetTenantLimit values
	ring          fairRing              // guarded by mu
	reserved      reservedLine          // guarded by mu
	fresh, idle   idleList              // guarded by mu
	freePermits   *permitState          // guarded by mu: released permit states, for reuse
	sampleTick    uint32                // guarded by mu
	lastNow       int64                 // guarded by mu: latest clock reading
	totals        counters              // guarded by mu
	evicted       uint64                // guarded by mu
	resDenied     uint64                // guarded by mu
	clusterLocal  uint64                // guarded by mu
	clusterErrors uint64                // guarded by mu
}

// New validates cfg and returns a Gate. A configuration that cannot work (a
// plan's cap or reservation above the capacity, negative numbers, an unknown
// default plan) is an error wrapping ErrInvalidConfig.
func New(cfg Config) (*Gate, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	g := &Gate{
		cfg:       cfg,
		capacity:  cfg.Capacity,
		tracer:    cfg.Tracer,
		cluster:   cfg.Cluster,
		epoch:     time.Now(),
		tenants:   make(map[string]*tenant),
		plans:     make(map[string]*planState, len(cfg.Plans)),
		overrides: make(map[string]int),
	}
	g.clock = func() int64 { return int64(time.Since(g.epoch)) + 1 } // never 0: 0 means "not measured"
	g.closing, g.stopClosing = context.WithCancel(context.Background())
	if rt, ok := cfg.Tracer.(ReleaseTracer); ok {
		g.releaseTracer = rt
	}
	for name, p := range cfg.Plans {
		g.plans[name] = newPlanState(name, p)
	}
	g.defaultPlan = g.plans[cfg.DefaultPlan]
	g.cfg.Plans = nil // g.plans is the truth from here on
	return g, nil
}

func newPlanState(name string, p Plan) *planState {
	return &planState{name: name, Plan: p, weight: max(1, p.Weight)}
}

// Capacity returns the global capacity.
func (g *Gate) Capacity() int { return g.capacity }

// Acquire waits for a permit for tenantID and returns it, or an error:
//   - ErrInvalidTenant (wrapped) for an empty, over-long or malformed ID;
//   - an *OverLimitError (errors.Is ErrOverLimit) when the tenant is at its
//     cap and its plan's queue is full, or it waited the plan's MaxWait;
//   - ctx's error (wrapped) when ctx ends first, errors.Is(err,
//     context.DeadlineExceeded) for a deadline;
//   - a Lookup error, ErrUnknownPlan, ErrTooManyTenants or ErrClosed (wrapped).
//
// ctx governs the whole admission: the Lookup, the wait for the tenant's cap
// and the wait for global capacity. A request that fails holds nothing.
func (g *Gate) Acquire(ctx context.Context, tenantID string) (Permit, error) {
	if g.tracer == nil {
		var d TraceAcquireEndData
		return g.acquire(ctx, tenantID, &d)
	}
	tctx := g.tracer.TraceAcquireStart(ctx, g, TraceAcquireStartData{Tenant: tenantID})
	d := TraceAcquireEndData{Tenant: tenantID}
	p, err := g.acquire(ctx, tenantID, &d)
	if p.s != nil {
		p.s.ctx = tctx // only this goroutine knows p yet
	}
	d.Err = err
	ended := false
	defer func() {
		if !ended {
			p.Release() // TraceAcquireEnd panicked: nobody will ever hold p
		}
	}()
	g.tracer.TraceAcquireEnd(tctx, g, d)
	ended = true
	return p, err
}

func (g *Gate) acquire(ctx context.Context, id string, d *TraceAcquireEndData) (Permit, error) {
	d.Outcome = Failed
	if len(id) == 0 || len(id) > g.cfg.MaxTenantIDLen {
		return Permit{}, validateID(id, g.cfg.MaxTenantIDLen)
	}
	if err := ctx.Err(); err != nil {
		d.Outcome = ctxOutcome(err)
		return Permit{}, fmt.Errorf("pool: tenant %q: %w", id, err)
	}
	var now int64
	if g.cfg.Lookup != nil || g.tracer != nil || g.cfg.Adaptive.Enabled {
		now = g.clock() // Lookup answers expire; traced and adaptive permits are all timed
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return Permit{}, ErrClosed
	}
	t := g.tenants[id] // a tracked ID was validated when it was first seen
	if t == nil || (g.cfg.Lookup != nil && now-t.resolvedAt > int64(g.cfg.LookupTTL) && !t.refreshing) {
		var err error
		if t, err = g.resolveLocked(ctx, id, t); err != nil {
			return Permit{}, err // resolveLocked unlocked
		}
	}
	if t.idleList != notIdle {
		g.unidleLocked(t)
	}
	if t.planVersion != t.plan.version {
		g.applyLimitLocked(t) // SetPlan has not reached this tenant yet
	} else if t.reserved < min(t.plan.ReservedConns, t.cap) {
		g.reserveLocked(t) // a reservation that did not fit may fit now
		g.dispatchLocked() // and its waiters may go first now
	}
	d.Plan, d.Limit, d.EffectiveLimit, d.InUse = t.plan.name, t.cap, t.limit, t.inUse

	c := t.wait
	var capQueued int // requests of t waiting for its cap
	if c != nil {
		capQueued = c.capQ.n
	}
	if g.cluster == nil && capQueued == 0 && (c == nil || c.globalQ.n == 0) {
		if t.inUse < t.limit && g.grantableLocked(t) {
			// The fast path: nobody of this tenant waits, its cap and global
			// capacity have room. Hold time is measured on one permit in 16
			// (all when traced or with a Lookup, which read the clock anyway),
			// because reading the clock costs more than the rest of this path.
			g.takeLocked(t)
			p := g.newPermitLocked(t)
			g.sampleTick++
			sample := g.sampleTick%holdSampleEvery == 0
			if now != 0 {
				p.s.start, p.s.weight = now, 1
			} else if sample {
				p.s.start, p.s.weight = g.nowLocked(), holdSampleEvery
			}
			if sample {
				g.sweepLocked(p.s.start, sweepBudget)
			}
			g.mu.Unlock()
			d.Outcome = Acquired
			return p, nil
		}
	}
	withinCap := t.held() < t.limit && capQueued == 0
	if !withinCap {
		// Decided before anything is allocated or the clock read: a tenant
		// flooding past its cap is exactly when rejections must be cheap.
		// Under an adaptive limit, requests that the cap would admit wait
		// for the effective limit outside MaxWaiting: adaptivity delays
		// work, it never turns it away.
		queueRoom := t.plan.MaxWaiting
		if t.ad != nil {
			queueRoom += max(0, t.cap-t.held())
		}
		if t.plan.MaxWaiting != Unbounded && capQueued >= queueRoom {
			err := &OverLimitError{Tenant: id, Limit: t.cap, RetryAfter: g.retryAfterLocked(t)}
			t.rejected++
			g.totals.rejected++
			g.mu.Unlock()
			d.Outcome = Rejected
			return Permit{}, err
		}
	}
	c = t.contended()
	if now == 0 {
		now = g.nowLocked()
	}
	w := &waiter{t: t, wake: make(chan struct{}, 1), enqueued: now}
	if mw := t.plan.MaxWait; mw > 0 {
		w.deadline = now + int64(mw)
	}
	switch {
	case withinCap && g.cluster != nil:
		// A tenant slot is free here; the cluster must agree.
		w.stage, w.promoted = stageCluster, now
		t.clusterPending++
		g.waiting++
		g.mu.Unlock()
		return g.clusterStep(ctx, w, d)
	case withinCap:
		d.Position = c.globalQ.n + 1
		w.stage, w.promoted = stageGlobal, now
		c.globalQ.pushBack(w)
		g.fixLinesLocked(t)
	default:
		d.Position = c.globalQ.n + c.capQ.n + 1
		w.stage = stageCap
		c.capQ.pushBack(w)
	}
	g.waiting++
	g.mu.Unlock()
	return g.wait(ctx, w, d)
}

const (
	holdSampleEvery = 16
	// sweepBudget bounds the idle tenants looked at per sweep, to keep the
	// work under the lock O(1).
	sweepBudget = 16
)

// adminBatch is how many tenants an administrative operation (SetPlan,
// EvictIdle, AppendTenantStats) handles per hold of the lock, so that after a
// flood of tenants admissions still get the lock between batches.
const adminBatch = 1024

// Test hooks. grantHook, when set, is called under the lock before every
// grant, to check invariants at the moment they matter; adminBatchHook between
// the batches of an administrative operation, unlocked; wakeIgnoredHook when a
// waiter woke to a signal that changed nothing for it.
var (
	grantHook                       func(g *Gate, t *tenant)
	adminBatchHook, wakeIgnoredHook func()
)

// takeLocked counts one permit granted to t.
func (g *Gate) takeLocked(t *tenant) {
	if grantHook != nil {
		grantHook(g, t)
	}
	if t.inUse < t.reserved {
		g.reservedFree--
	}
	t.inUse++
	if t.ad != nil {
		t.ad.granted(t.inUse)
	}
	g.used++
	t.acquired++
	g.totals.acquired++
}

// grantWaiterLocked hands a permit, already counted by takeLocked, to w.
func (g *Gate) grantWaiterLocked(w *waiter, now int64) {
	p := g.newPermitLocked(w.t)
	p.s.start, p.s.weight = now, 1
	p.s.lease, w.lease = w.lease, nil
	w.permit = p
	w.stage = stageDone
	w.granted = now
	g.waiting--
	w.signal()
}

// nowLocked reads the clock and remembers the reading.
func (g *Gate) nowLocked() int64 {
	now := g.clock()
	if now > g.lastNow {
		g.lastNow = now
	}
	return g.lastNow
}
