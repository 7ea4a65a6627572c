package pool

import (
	"fmt"
	"unicode/utf8"
)

// planState is a configured plan. Tenants point at it, so SetPlan can change a
// plan for all its tenants in place.
type planState struct {
	name    string
	Plan           // guarded by Gate.mu
	weight  int    // guarded by Gate.mu: Plan.Weight, 0 made 1
	version uint32 // guarded by Gate.mu: bumped by SetPlan; tenants behind it re-apply their limits
}

func newPlanState(name string, p Plan) *planState {
	return &planState{name: name, Plan: p, weight: max(1, p.Weight)}
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

	clusterPending int // guarded by Gate.mu: requests holding a tenant slot while they ask for a cluster slot

	wait *contention    // guarded by Gate.mu: nil until the tenant first waits
	ad   *adaptiveLimit // guarded by Gate.mu: nil unless Config.Adaptive is enabled

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

// contention is what a tenant needs while its requests wait.
type contention struct {
	capQ    list[waiter] // requests over the tenant's limit, waiting for one of its slots
	globalQ list[waiter] // requests holding a tenant slot, waiting for global capacity

	ringLink      link[tenant] // in the fair ring while globalQ is not empty
	credit        int          // grants left in the tenant's turn in the ring; kept while it is backlogged
	resLink       link[tenant] // in the reserved line while globalQ is not empty and inUse < reserved
	inRing, inRes bool
}

// contended returns t's contention state, creating it on t's first wait.
func (t *tenant) contended() *contention {
	if t.wait == nil {
		t.wait = &contention{}
		t.wait.ringLink.v, t.wait.resLink.v = t, t
	}
	return t.wait
}

// waiting is how many of the tenant's requests wait, at any stage.
func (t *tenant) waiting() int {
	if t.wait == nil {
		return t.clusterPending
	}
	return t.wait.capQ.n + t.wait.globalQ.n + t.clusterPending
}

// held is how many tenant slots are taken: permits in use plus requests
// waiting for a cluster slot or for global capacity.
func (t *tenant) held() int {
	if t.wait == nil {
		return t.inUse + t.clusterPending
	}
	return t.inUse + t.wait.globalQ.n + t.clusterPending
}

func (t *tenant) isIdle() bool { return t.inUse == 0 && t.waiting() == 0 }

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
