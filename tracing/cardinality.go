package tracing

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/tenantdb/tenantdb/pool"
)

// Cardinality is how per-tenant metrics label tenants, chosen with ByTenant,
// ByPlan or TopTenants. Each has a bound on the series an instrument can
// have, however many distinct tenant IDs arrive: a label is either a tenant
// within the bound, a plan, or "other" ([OtherTenants]).
//
// Two kinds of instrument behave differently. The gauges (in use, waiting,
// limit) are observed at each collection from the Gate's stats, and a series
// not observed in a collection is not exported. The counters and histograms
// (rejections, wait and use time, leaks) are recorded as things happen and,
// being cumulative, export every series they ever had for the life of the
// MeterProvider; so a tenant label, once used there, is used for good, and
// their bound is over the Tracer's life.
type Cardinality struct {
	by    labelBy
	n     int // TopTenants: tenants labelled in one collection's gauges
	limit int // ByTenant, TopTenants: tenants ever labelled in counters and histograms
}

type labelBy uint8

const (
	byTopTenants labelBy = iota // the zero Cardinality is TopTenants(10, 100)
	byTenant
	byPlan
)

const (
	defaultTopN        = 10
	defaultTenantLimit = 100
)

// ByTenant labels each tenant with its own ID (TenantKey), in the gauges as
// in the counters and histograms, for the first limit tenants the Tracer
// sees; the rest are "other". Bound: limit+1 tenant labels per instrument.
// Suits services with a known, modest number of tenants. limit <= 0 means 100.
func ByTenant(limit int) Cardinality {
	if limit <= 0 {
		limit = defaultTenantLimit
	}
	return Cardinality{by: byTenant, limit: limit}
}

// ByPlan labels series with the tenant's plan (PlanKey) instead of the
// tenant, for services with too many tenants to label each. Bound: the
// number of plans, which the operator, not the tenants, controls.
func ByPlan() Cardinality { return Cardinality{by: byPlan} }

// TopTenants labels the n busiest tenants, by connections in use plus
// requests waiting, and sums everyone else as "other". The set is recomputed
// at each collection from the Gate's stats, so it needs ObservePool or
// ObserveGate. In the gauges it is exact: at most n+1 series per collection.
// The counters and histograms label a tenant that was among the n busiest at
// the last collection, or that is refused or waits in its own queue (so a
// burst between two collections is named by its tenant), and keep a label
// once given, until limit tenants have had a label there; after that,
// newcomers count as "other" in them (the gauges still name them).
// Bound: n+1 gauge series, limit+1 counter and histogram series.
// n <= 0 means 10; limit below n means n.
func TopTenants(n, limit int) Cardinality {
	if n <= 0 {
		n = defaultTopN
	}
	return Cardinality{by: byTopTenants, n: n, limit: max(limit, n)}
}

func (c Cardinality) withDefaults() Cardinality {
	if c.by == byTopTenants && c.n == 0 {
		return TopTenants(defaultTopN, defaultTenantLimit)
	}
	return c
}

func (c Cardinality) String() string {
	switch c.by {
	case byTenant:
		return fmt.Sprintf("ByTenant(%d)", c.limit)
	case byPlan:
		return "ByPlan()"
	default:
		c = c.withDefaults()
		return fmt.Sprintf("TopTenants(%d, %d)", c.n, c.limit)
	}
}

// numOutcomes is the number of pool.Outcome values.
const numOutcomes = int(pool.Failed) + 1

// series is one label's precomputed measurement options: attribute sets are
// built once per label, not per measurement.
type series struct {
	label     string
	add       []metric.AddOption
	rec       []metric.RecordOption
	obs       []metric.ObserveOption
	addByOutc [numOutcomes][]metric.AddOption
	recByOutc [numOutcomes][]metric.RecordOption
	// refusals are the rejection counter's: by outcome (rejected or
	// timed_out) and cause; timeouts the timeout counter's, by limit.
	refusals [2][numCauses][]metric.AddOption
	timeouts [numTimeLimits][]metric.AddOption
}

// The causes of a refusal (CauseKey), and the time limits (TimeLimitKey).
var (
	causes     = [...]string{CauseCap, CauseBudget, CauseDeadline}
	timeLimits = [...]pool.TimeLimit{pool.LimitStatement, pool.LimitIdleInTransaction, pool.LimitMaxHold}
)

const (
	numCauses     = len(causes)
	numTimeLimits = len(timeLimits)
)

func newSeries(key attribute.Key, label string, base []attribute.KeyValue) *series {
	attrs := append(slices.Clip(base), key.String(label))
	set := attribute.NewSet(attrs...)
	s := &series{
		label: label,
		add:   []metric.AddOption{metric.WithAttributeSet(set)},
		rec:   []metric.RecordOption{metric.WithAttributeSet(set)},
		obs:   []metric.ObserveOption{metric.WithAttributeSet(set)},
	}
	for o := range numOutcomes {
		set := attribute.NewSet(append(slices.Clip(attrs), OutcomeKey.String(pool.Outcome(o).String()))...)
		s.addByOutc[o] = []metric.AddOption{metric.WithAttributeSet(set)}
		s.recByOutc[o] = []metric.RecordOption{metric.WithAttributeSet(set)}
	}
	for i, o := range [2]pool.Outcome{pool.Rejected, pool.TimedOut} {
		for c, cause := range causes {
			set := attribute.NewSet(append(slices.Clip(attrs), OutcomeKey.String(o.String()), CauseKey.String(cause))...)
			s.refusals[i][c] = []metric.AddOption{metric.WithAttributeSet(set)}
		}
	}
	for i, l := range timeLimits {
		set := attribute.NewSet(append(slices.Clip(attrs), TimeLimitKey.String(l.String()))...)
		s.timeouts[i] = []metric.AddOption{metric.WithAttributeSet(set)}
	}
	return s
}

// labeler maps tenants to the series of a Cardinality.
type labeler struct {
	card  Cardinality
	key   attribute.Key        // TenantKey, or PlanKey for ByPlan
	base  []attribute.KeyValue // on every series: the pool name
	other *series

	sets sync.Map // label → *series: every label that has series

	mu      sync.Mutex
	tenants int         // guarded by mu: tenant labels handed out, at most card.limit
	full    atomic.Bool // tenants reached card.limit: no more labels, skip mu

	top atomic.Pointer[map[string]struct{}] // TopTenants: the busiest at the last collection
}

func newLabeler(card Cardinality, base []attribute.KeyValue) *labeler {
	card = card.withDefaults()
	l := &labeler{card: card, key: TenantKey, base: base}
	if card.by == byPlan {
		l.key = PlanKey
	}
	l.other = newSeries(l.key, OtherTenants, base)
	return l
}

// forTenant returns the series a measurement for tenant on plan goes to.
// hot marks a measurement of the tenant's own pressure (a refusal, a wait
// in its own queue): under TopTenants it earns the tenant a label, within
// the budget, even if it was not among the busiest at the last collection,
// so that a burst between two collections is the tenant's, not "other"'s.
func (l *labeler) forTenant(tenant, plan string, hot bool) *series {
	switch l.card.by {
	case byPlan:
		if plan == "" {
			return l.other
		}
		if s, ok := l.sets.Load(plan); ok {
			return s.(*series)
		}
		// Plans are few and set by the operator: no budget needed.
		s, _ := l.sets.LoadOrStore(plan, newSeries(l.key, strings.Clone(plan), l.base))
		return s.(*series)
	case byTopTenants:
		if s, ok := l.sets.Load(tenant); ok {
			return s.(*series) // a label, once given, is kept: its series exist for good anyway
		}
		if !hot && !l.inTop(tenant) {
			return l.other
		}
	}
	if s, ok := l.sets.Load(tenant); ok {
		return s.(*series)
	}
	if l.full.Load() {
		return l.other
	}
	return l.admit(tenant)
}

// inTop reports whether tenant was among the busiest at the last collection.
func (l *labeler) inTop(tenant string) bool {
	top := l.top.Load()
	if top == nil {
		return false
	}
	_, ok := (*top)[tenant]
	return ok
}

// admit gives tenant a label of its own if the budget allows.
func (l *labeler) admit(tenant string) *series {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.sets.Load(tenant); ok {
		return s.(*series)
	}
	if l.tenants >= l.card.limit || tenant == OtherTenants {
		return l.other
	}
	s := newSeries(l.key, strings.Clone(tenant), l.base)
	l.sets.Store(s.label, s)
	l.tenants++
	if l.tenants >= l.card.limit {
		l.full.Store(true)
	}
	return s
}

// gaugePoint is one gauge series of a collection.
type gaugePoint struct {
	obs            []metric.ObserveOption
	inUse, waiting int64
	limit          int64 // -1: not a single tenant, no limit to report
	effective      int64 // the effective limit, when limit is reported
	budgeted       bool  // a single tenant on a plan with a Budget: budgetLeft is reported
	budgetLeft     float64
}

// collect turns the Gate's tenant stats into the gauge points of one
// collection, and for TopTenants publishes the busiest tenants for the
// counters and histograms. "other" is always reported, if only as zeros.
func (l *labeler) collect(stats []pool.TenantStat) []gaugePoint {
	points := make([]gaugePoint, 0, 16)
	other := gaugePoint{obs: l.other.obs, limit: -1}
	switch l.card.by {
	case byPlan, byTenant:
		idx := make(map[*series]int)
		for i := range stats {
			st := &stats[i]
			s := l.forTenant(st.Tenant, st.Plan, false)
			if s == l.other {
				other.inUse += int64(st.InUse)
				other.waiting += int64(st.Waiting)
				continue
			}
			j, ok := idx[s]
			if !ok {
				j = len(points)
				idx[s] = j
				limit, effective := int64(-1), int64(-1)
				budgeted := false
				if l.card.by == byTenant {
					limit, effective, budgeted = int64(st.Limit), int64(st.EffectiveLimit), st.Budgeted
				}
				points = append(points, gaugePoint{obs: s.obs, limit: limit, effective: effective,
					budgeted: budgeted, budgetLeft: st.BudgetLeft.Seconds()})
			}
			points[j].inUse += int64(st.InUse)
			points[j].waiting += int64(st.Waiting)
		}
	default:
		busiest := busiest(stats, l.card.n)
		top := make(map[string]struct{}, len(busiest))
		for _, st := range busiest {
			top[st.Tenant] = struct{}{}
			var obs []metric.ObserveOption
			if s, ok := l.sets.Load(st.Tenant); ok {
				obs = s.(*series).obs
			} else {
				// A gauge series lives for one collection: it needs no
				// label budget, only attributes.
				obs = newSeries(l.key, st.Tenant, l.base).obs
			}
			points = append(points, gaugePoint{obs: obs, inUse: int64(st.InUse),
				waiting: int64(st.Waiting), limit: int64(st.Limit), effective: int64(st.EffectiveLimit),
				budgeted: st.Budgeted, budgetLeft: st.BudgetLeft.Seconds()})
		}
		for i := range stats {
			if _, ok := top[stats[i].Tenant]; !ok {
				other.inUse += int64(stats[i].InUse)
				other.waiting += int64(stats[i].Waiting)
			}
		}
		l.top.Store(&top)
	}
	return append(points, other)
}

// busiest returns up to n tenants with something in use or waiting (a tenant
// whose ID is "other" is always counted as other), busiest first: by in use plus waiting, then by refusals, then by ID so that ties
// are settled the same way at every collection.
func busiest(stats []pool.TenantStat, n int) []pool.TenantStat {
	busy := make([]pool.TenantStat, 0, min(n*2, len(stats)))
	for _, st := range stats {
		if st.InUse+st.Waiting > 0 && st.Tenant != OtherTenants {
			busy = append(busy, st)
		}
	}
	slices.SortFunc(busy, func(a, b pool.TenantStat) int {
		if c := cmp.Compare(b.InUse+b.Waiting, a.InUse+a.Waiting); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Rejected+b.TimedOut, a.Rejected+a.TimedOut); c != 0 {
			return c
		}
		return strings.Compare(a.Tenant, b.Tenant)
	})
	return busy[:min(n, len(busy))]
}
