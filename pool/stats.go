package pool

import (
	"slices"
	"time"
)

// TenantStat is a snapshot of one tracked tenant.
type TenantStat struct {
	Tenant string
	Plan   string
	// Server is the server its permits are granted on (Config.Servers); ""
	// without servers. Database is the database of its placement there
	// (Config.Placement), "" for the default.
	Server, Database string
	// Limit is the tenant's cap; Reserved its reservation in force.
	Limit, Reserved int
	// EffectiveLimit is how many permits the tenant may hold now: Limit, or
	// with Config.Adaptive its adaptive limit, from the floor up to Limit.
	// Lowering it revokes nothing: permits above it stay until released.
	EffectiveLimit int
	// InUse counts permits held; Waiting, requests waiting for the tenant's
	// cap or for global capacity.
	InUse, Waiting int
	// Acquired, Rejected, TimedOut and Cancelled count admissions by outcome
	// since the tenant was first seen (or last evicted).
	Acquired, Rejected, TimedOut, Cancelled uint64
	// WaitTime is the total time requests waited. HoldTime is the total time
	// permits were held: exact for permits that waited or were traced, and
	// estimated from a one-in-16 sample of the others.
	WaitTime, HoldTime time.Duration
	// AvgHold is a moving average of the measured hold times, which
	// OverLimitError.RetryAfter is derived from; 0 until one is measured.
	AvgHold time.Duration
	// BudgetUsed is the connection-time held by the tenant's permits
	// released under a budget (Plan.Budget); BudgetLeft what is left of it
	// for the next request: the bucket less the expected hold of each
	// permit in use or waiting for one with a tenant slot, negative in
	// debt, 0 without a budget. OverBudget counts the requests its budget
	// refused (rejected or timed out, also counted in Rejected and
	// TimedOut), so Rejected+TimedOut-OverBudget were refused by the cap.
	BudgetUsed, BudgetLeft time.Duration
	OverBudget             uint64
	// Budgeted reports that the tenant's plan has a Budget now.
	Budgeted bool
	// StatementTimeouts, IdleTimeouts and HoldTimeouts count the work its
	// holder ended for a time limit (Permit.Exceeded): statements past
	// StatementTimeout, transactions idle for IdleInTransactionTimeout,
	// holds past MaxHold.
	StatementTimeouts, IdleTimeouts, HoldTimeouts uint64
	// Classes has one entry per class, the default class first, with
	// Config.Classes set; else nil. The entries add up to the tenant:
	// their Acquired, Rejected, TimedOut, Cancelled, WaitTime, HoldTime,
	// InUse and Waiting sum to the tenant's.
	Classes []ClassStat
}

// ClassStat is a snapshot of one class: of one tenant's work of the class
// (in TenantStat), or of all tenants' (in Stat).
type ClassStat struct {
	// Class is the class's name, DefaultClass for work without one.
	Class string
	// Limit is the most permits of the class that may be held at once: in
	// a TenantStat, the class's cap for the tenant (its effective limit for
	// the default class); in a Stat, the class's MaxShare of the capacity.
	Limit int
	// InUse counts permits of the class held; Waiting, its requests waiting.
	InUse, Waiting int
	// Acquired, Rejected, TimedOut and Cancelled count admissions by outcome.
	Acquired, Rejected, TimedOut, Cancelled uint64
	// WaitTime and HoldTime are as TenantStat's, for the class's requests.
	WaitTime, HoldTime time.Duration
	// In a TenantStat, for a class with a Budget (Class.Budget), the
	// tenant's budget for the class, as TenantStat's BudgetUsed,
	// BudgetLeft, OverBudget and Budgeted are for the tenant's own.
	BudgetUsed, BudgetLeft time.Duration
	OverBudget             uint64
	Budgeted               bool
}

// Stat is a snapshot of the whole Gate. Counters include evicted tenants.
type Stat struct {
	Capacity int
	// InUse and Waiting add up all tenants'.
	InUse, Waiting int
	// Tenants is the number tracked; Reserved the reservations in force.
	Tenants, Reserved                       int
	Acquired, Rejected, TimedOut, Cancelled uint64
	WaitTime, HoldTime                      time.Duration
	// Evicted counts tenants removed as idle or to make room.
	Evicted uint64
	// ReservationsDenied counts tenants whose plan's reservation did not fit
	// in Config.MaxReserved when they came.
	ReservationsDenied uint64
	// ClusterLocal counts permits granted with a cluster slot enforced by
	// this process only, because the cluster store was unavailable (fail
	// open); ClusterErrors, requests failed because of it (fail closed).
	ClusterLocal, ClusterErrors uint64
	// Classes has one entry per class, the default class first, with
	// Config.Classes set; else nil.
	Classes []ClassStat
}

// Stat returns a snapshot of the Gate.
func (g *Gate) Stat() Stat {
	var classes []ClassStat
	if len(g.classes) > 1 {
		classes = make([]ClassStat, 0, len(g.classes)) // allocated unlocked
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := 0; i < cap(classes); i++ {
		c := g.classes[i]
		share := 0
		for _, s := range g.serverList {
			share += s.classes[i].share
		}
		classes = append(classes, classStat(c.name, share, c.used, c.waiting, &c.counters))
	}
	return Stat{
		Capacity: g.cfg.Capacity, InUse: g.used, Waiting: g.waiting,
		Tenants: len(g.tenants), Reserved: g.reservedLocked(),
		Acquired: g.totals.outcomes[Acquired], Rejected: g.totals.outcomes[Rejected],
		TimedOut: g.totals.outcomes[TimedOut], Cancelled: g.totals.outcomes[Cancelled],
		WaitTime: time.Duration(g.totals.waitTotal), HoldTime: time.Duration(g.totals.holdTotal),
		Evicted: g.evicted, ReservationsDenied: g.resDenied,
		ClusterLocal: g.clusterLocal, ClusterErrors: g.clusterErrors,
		Classes: classes,
	}
}

func classStat(name string, limit, inUse, waiting int, c *counters) ClassStat {
	return ClassStat{
		Class: name, Limit: limit, InUse: inUse, Waiting: waiting,
		Acquired: c.outcomes[Acquired], Rejected: c.outcomes[Rejected],
		TimedOut: c.outcomes[TimedOut], Cancelled: c.outcomes[Cancelled],
		WaitTime: time.Duration(c.waitTotal), HoldTime: time.Duration(c.holdTotal),
	}
}

// TenantStat returns a snapshot of tenantID, and false when it is not tracked
// (never seen, or evicted as idle).
func (g *Gate) TenantStat(tenantID string) (TenantStat, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.tenants[tenantID]
	if t == nil {
		return TenantStat{Tenant: tenantID}, false
	}
	if t.planVersion != t.plan.version {
		g.applyLimitLocked(t)
	}
	return g.tenantStatLocked(t), true
}

// Waiting returns how many of tenantID's requests wait, at any stage: the
// TenantStat count without the snapshot, cheap enough for every release.
func (g *Gate) Waiting(tenantID string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t := g.tenants[tenantID]; t != nil {
		return t.waiting()
	}
	return 0
}

// AppendTenantStat appends a snapshot of every tracked tenant to dst. It
// visits the tenants adminBatch at a time, releasing the lock in between, so
// each tenant's snapshot is consistent but they are not all taken at the same
// instant. Call it at metric collection intervals, not per request.
func (g *Gate) AppendTenantStat(dst []TenantStat) []TenantStat {
	g.mu.Lock()
	n := len(g.tenants)
	g.mu.Unlock()
	dst = slices.Grow(dst, n) // grown unlocked: copying a growing slice under the lock stalls admissions
	g.forEachTenant(func(t *tenant) {
		if t.planVersion != t.plan.version {
			g.applyLimitLocked(t)
		}
		dst = append(dst, g.tenantStatLocked(t))
	})
	return dst
}

func (g *Gate) tenantStatLocked(t *tenant) TenantStat {
	s := TenantStat{
		Tenant: t.id, Plan: t.plan.name, Server: t.srv.name,
		Limit: t.cap, EffectiveLimit: t.limit, Reserved: t.reserved, InUse: t.inUse, Waiting: t.waiting(),
		Acquired: t.outcomes[Acquired], Rejected: t.outcomes[Rejected],
		TimedOut: t.outcomes[TimedOut], Cancelled: t.outcomes[Cancelled],
		WaitTime: time.Duration(t.waitTotal), HoldTime: time.Duration(t.holdTotal),
		AvgHold: time.Duration(t.avgHold),
	}
	if t.place != nil {
		s.Database = t.place.Database
	}
	if t.plan.Budget.Rate > 0 {
		s.Budgeted = true
		s.BudgetLeft = time.Duration(g.budgetLeftLocked(t, pendingSlots(t), g.nowLocked()))
	}
	if b := t.bucket; b != nil {
		s.BudgetUsed, s.OverBudget = time.Duration(b.used), b.refused
	}
	if e := t.exceeded; e != nil {
		s.StatementTimeouts, s.IdleTimeouts, s.HoldTimeouts = e[LimitStatement], e[LimitIdleInTransaction], e[LimitMaxHold]
	}
	if len(g.classes) > 1 {
		s.Classes = make([]ClassStat, len(g.classes))
		if t.wait == nil {
			// Without contention state, all t did was of the default class.
			s.Classes[0] = classStat(DefaultClass, t.limit, t.inUse, t.waiting(), &t.counters)
			for i, c := range g.classes[1:] {
				s.Classes[i+1] = ClassStat{Class: c.name, Limit: min(t.plan.classCaps[i+1], t.cap),
					Budgeted: c.Budget.Rate > 0, BudgetLeft: time.Duration(c.burst)} // a bucket starts full
			}
		} else {
			for i := range t.wait.lanes {
				l := &t.wait.lanes[i]
				s.Classes[i] = classStat(l.class.name, g.laneLimitLocked(l), l.inUse, l.waiting(), &l.counters)
				if l.class.Budget.Rate > 0 {
					s.Classes[i].Budgeted = true
					s.Classes[i].BudgetLeft = time.Duration(g.classBudgetLeftLocked(l, g.nowLocked()))
				}
				if b := l.bucket; b != nil {
					s.Classes[i].BudgetUsed, s.Classes[i].OverBudget = time.Duration(b.used), b.refused
				}
			}
		}
	}
	return s
}

// Plans returns a copy of the plans in force (as configured and changed by
// SetPlan) and the name of the default plan. It copies every plan under the
// lock: call it for reports, not per request.
func (g *Gate) Plans() (plans map[string]Plan, defaultPlan string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	plans = make(map[string]Plan, len(g.plans))
	for name, ps := range g.plans {
		plans[name] = ps.Plan
	}
	return plans, g.defaultPlan.name
}

// reservedLocked is the reservations in force on every server.
func (g *Gate) reservedLocked() int {
	n := 0
	for _, s := range g.serverList {
		n += s.reservedTotal
	}
	return n
}

// MaxReserved returns Config.MaxReserved with its default applied: the most
// global capacity the reservations in force may keep (on each server, with
// Config.Servers).
func (g *Gate) MaxReserved() int { return g.cfg.MaxReserved }
