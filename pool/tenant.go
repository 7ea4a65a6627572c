package pool

import (
	"fmt"
	"time"
	"unicode/utf8"
)

// planState is a configured plan. Tenants point at it, so SetPlan can change a
// plan for all its tenants in place.
type planState struct {
	name      string
	Plan             // guarded by Gate.mu
	weight    int    // guarded by Gate.mu: Plan.Weight, 0 made 1
	version   uint32 // guarded by Gate.mu: bumped by SetPlan; tenants behind it re-apply their limits
	classCaps []int  // guarded by Gate.mu: the cap of each class (by index) for the plan's tenants; nil without classes
	burst     int64  // guarded by Gate.mu: Plan.Budget's burst with its default, ns
}

func newPlanState(name string, p Plan, classes []*classState) *planState {
	return &planState{name: name, Plan: p, weight: max(1, p.Weight), classCaps: classCaps(p, classes), burst: p.Budget.burst()}
}

// tenant is the state of one tracked tenant. It is kept small (about 150
// bytes) because up to Config.MaxTenants of them may be idle at once; what only
// contended tenants need lives in *contention.
type tenant struct {
	id   string
	plan *planState // guarded by Gate.mu

	cap       int // guarded by Gate.mu: the cap (override, Lookup answer, or plan)
	limit     int // guarded by Gate.mu: effective limit: cap, or the adaptive limit within it
	lookupMax int // guarded by Gate.mu: Lookup's MaxConns override, 0 for none
	reserved  int // guarded by Gate.mu: reservation in force, at most min(plan.ReservedConns, cap)
	inUse     int // guarded by Gate.mu: permits granted and not released

	limits       timeLimits  // guarded by Gate.mu: its work's time limits (the default class's), set with its cap
	lookupLimits *timeLimits // guarded by Gate.mu: Lookup's overrides of its plan's time limits, nil for none

	clusterPending int // guarded by Gate.mu: requests holding a tenant slot while they ask for a cluster slot

	wait   *contention    // guarded by Gate.mu: nil until the tenant first waits or uses a class
	ad     *adaptiveLimit // guarded by Gate.mu: nil unless Config.Adaptive is enabled
	bucket *bucket        // guarded by Gate.mu: nil until its plan's Budget is first checked

	exceeded *[numTimeLimits]uint64 // guarded by Gate.mu: work ended for each time limit (Permit.Exceeded); nil until one
	place    *placed                // guarded by Gate.mu: where its permits are granted (Config.Placement)
	srv      *shared                // guarded by Gate.mu: place.srv, the server whose capacity it takes
	next     *placed                // guarded by Gate.mu: a new placement, taken once it holds no capacity
	move     *drainState            // guarded by Gate.mu: the drain in force (Gate.Drain), nil for none

	idleList          uint8        // guarded by Gate.mu: which idle list holds the tenant, if any
	reservationDenied bool         // guarded by Gate.mu: its reservation did not fit; counted once
	planVersion       uint32       // guarded by Gate.mu: the plan's version its limits were computed from
	refreshing        bool         // guarded by Gate.mu: a Lookup refresh is under way
	idleLink          link[tenant] // guarded by Gate.mu: in Gate.fresh or Gate.idle
	idleSince         int64        // guarded by Gate.mu: clock when stamped idle
	resolvedAt        int64        // guarded by Gate.mu: clock of the Lookup answer in use
	avgHold           int64        // guarded by Gate.mu: moving average of measured hold times, ns
	counters                       // guarded by Gate.mu
}

// contention is what a tenant needs while its requests wait, or once it
// uses a class: one lane per class of the Gate, the default class first.
type contention struct {
	lanes []lane
}

// lane is one class's part of one tenant: its permits held and its
// requests waiting, for the tenant's cap and for global capacity.
type lane struct {
	t     *tenant
	class *classState

	inUse          int          // guarded by Gate.mu: permits of the class the tenant holds
	clusterPending int          // guarded by Gate.mu: of t.clusterPending, this class's
	capQ           list[waiter] // requests over the lane's limit or the tenant's cap, waiting for a slot
	globalQ        list[waiter] // requests holding a tenant slot, waiting for global capacity

	ringLink      link[lane] // in the class's fair ring while globalQ is not empty
	credit        int        // grants left in the lane's turn in the ring; kept while it is backlogged
	affine        int        // grants taken by affinity that its turns in the ring have not paid back, at most Config.Affinity
	resLink       link[lane] // in the class's reserved line while globalQ is not empty and t.inUse < t.reserved
	inRing, inRes bool
	avgHold       int64   // moving average of the class's measured hold times, ns
	bucket        *bucket // the tenant's budget for the class (Class.Budget); nil until first checked
	counters
}

// contended returns t's contention state, creating it, with n lanes, on
// t's first wait or class. Every permit t holds then, and every admission
// it counted, is of the default class, as a class creates the state before
// its first grant.
func (t *tenant) contended(classes []*classState) *contention {
	if t.wait == nil {
		c := &contention{lanes: make([]lane, len(classes))}
		for i := range c.lanes {
			l := &c.lanes[i]
			l.t, l.class = t, classes[i]
			l.ringLink.v, l.resLink.v = l, l
		}
		// Everything t did so far was of the default class: its lane
		// starts with t's counters, so that the lanes add up to t.
		c.lanes[0].inUse = t.inUse
		c.lanes[0].counters = t.counters
		c.lanes[0].avgHold = t.avgHold
		t.wait = c
	}
	return t.wait
}

// waiting is how many of the tenant's requests wait, at any stage.
func (t *tenant) waiting() int {
	n := t.clusterPending
	if t.wait != nil {
		for i := range t.wait.lanes {
			l := &t.wait.lanes[i]
			n += l.capQ.n + l.globalQ.n
		}
	}
	return n
}

// held is how many tenant slots are taken: permits in use plus requests
// waiting for a cluster slot or for global capacity.
func (t *tenant) held() int {
	n := t.inUse + t.clusterPending
	if t.wait != nil {
		for i := range t.wait.lanes {
			n += t.wait.lanes[i].globalQ.n
		}
	}
	return n
}

func (t *tenant) isIdle() bool { return t.inUse == 0 && t.waiting() == 0 && t.move == nil }

// held is how many of the tenant's slots the lane takes.
func (l *lane) held() int { return l.inUse + l.globalQ.n + l.clusterPending }

// waiting is how many of the lane's requests wait, at any stage.
func (l *lane) waiting() int { return l.capQ.n + l.globalQ.n + l.clusterPending }

// policy is the lane's queue policy: the plan's for the default class, the
// class's for the others.
func (l *lane) policy() (maxWaiting int, maxWait time.Duration) {
	if l.class.index == 0 {
		return l.t.plan.MaxWaiting, l.t.plan.MaxWait
	}
	return l.class.MaxWaiting, l.class.MaxWait
}

// counters are cumulative, per tenant and for the whole Gate.
type counters struct {
	outcomes             [Failed]uint64 // admissions by outcome; failures are not counted
	waitTotal, holdTotal int64          // ns
}

// validateID reports why id cannot name a tenant, or nil.
func validateID(id string, maxLen int) error {
	if id == "" {
		return fmt.Errorf("%w: empty", ErrInvalidTenant)
	}
	if len(id) > maxLen {
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidTenant, len(id), maxLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: control character at byte %d", ErrInvalidTenant, i)
		}
		if c >= utf8.RuneSelf {
			if !utf8.ValidString(id) {
				return fmt.Errorf("%w: not valid UTF-8", ErrInvalidTenant)
			}
			break
		}
	}
	return nil
}
