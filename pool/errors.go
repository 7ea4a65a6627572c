package pool

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrOverLimit is matched (with errors.Is) by every [*OverLimitError]: the
	// tenant held its whole cap and its queue was full, or it waited Plan.MaxWait
	// without getting a slot. Callers usually turn it into HTTP 429.
	ErrOverLimit = errors.New("tenant over its connection limit")

	// ErrOverBudget is matched, besides ErrOverLimit, by an [*OverLimitError]
	// whose Cause is CauseBudget: the tenant spent its plan's share of
	// connection-time (Plan.Budget).
	ErrOverBudget = errors.New("tenant over its connection-time budget")

	// ErrClosed is returned by Acquire after Close, and to requests that were
	// still waiting when Close was called.
	ErrClosed = errors.New("pool: closed")

	// ErrInvalidTenant is returned when a tenant ID is empty, longer than
	// Config.MaxTenantIDLen, not valid UTF-8 or contains control characters.
	// Such a request is never served from a shared bucket.
	ErrInvalidTenant = errors.New("pool: invalid tenant ID")

	// ErrTooManyTenants is returned when a new tenant would exceed
	// Config.MaxTenants and every tracked tenant is busy (in use or waiting),
	// so none can be evicted to make room.
	ErrTooManyTenants = errors.New("pool: too many tenants")

	// ErrLookup is matched by the error of a request whose Config.Lookup
	// call failed, together with what Lookup returned: a failure of the
	// store behind Lookup, not of the request (even when Lookup's error
	// wraps a context error of its own).
	ErrLookup = errors.New("pool: lookup failed")

	// ErrUnknownPlan is returned when Lookup names a plan that is not configured.
	ErrUnknownPlan = errors.New("pool: unknown plan")

	// ErrUnknownClass is returned (wrapped) when a request's context names a
	// class (WithClass) that is not one of Config.Classes, or a malformed
	// one. Such a request is never served as another class.
	ErrUnknownClass = errors.New("pool: unknown class")

	// ErrInvalidConfig wraps every configuration error from New, SetPlan and
	// SetTenantLimit.
	ErrInvalidConfig = errors.New("pool: invalid config")

	// ErrNoTenant is the one sentinel of a request without a tenant, which is
	// refused rather than served from a shared bucket: tenantdb.ErrNoTenant,
	// poolhttp.ErrNoTenant and tenantgrpc.ErrNoTenant are this error, so
	// errors.Is matches it from every adapter.
	ErrNoTenant = errors.New("no valid tenant")

	// ErrRunnerOwnGate is returned by Acquire to a job of a Runner that asks
	// the Runner's own Gate for a slot: the job's permit already holds one of
	// its tenant's slots, so at a cap of 1 such a call could never be
	// admitted. Give the Runner a Gate of its own.
	ErrRunnerOwnGate = errors.New("pool: a Runner's job asked its Runner's own Gate for a slot; give the Runner a Gate of its own")
)

// OverLimitError reports a request refused because its tenant is at its own
// limit: rejected on arrival (its queue was full, or the cluster had no slot
// and the plan does not wait), or timed out after waiting Plan.MaxWait.
// errors.Is(err, ErrOverLimit) holds for it.
type OverLimitError struct {
	// Tenant is the tenant that was refused.
	Tenant string
	// Class is the request's class (WithClass), empty for the default class.
	Class string
	// Limit is the tenant's cap when it was refused (its plan's MaxConns, a
	// Lookup override or SetTenantLimit), whether it was refused on arrival
	// or after waiting; for a request of a class whose own cap was full, the
	// class's cap for the tenant. Under Config.Adaptive the request may have waited
	// for a lower effective limit (TenantStat.EffectiveLimit).
	Limit int
	// RetryAfter estimates when a retry is likely to find a free slot, from the
	// tenant's observed hold times and how many of its requests are ahead.
	// It is always positive and at most Config.MaxRetryAfter.
	RetryAfter time.Duration
	// Waited is how long the request waited in the tenant's queue before it
	// was refused: zero when it was rejected at once, about Plan.MaxWait when
	// the wait ran out.
	Waited time.Duration
	// Cause is what refused it: CauseCap (its cap or queue) or CauseBudget
	// (its plan's Budget of connection-time, with room under its cap).
	Cause LimitCause
}

// LimitCause says what refused a request (OverLimitError.Cause).
type LimitCause uint8

const (
	// CauseCap: the tenant (or its class) was at its cap and its queue was
	// full, or it waited its MaxWait for a slot.
	CauseCap LimitCause = iota
	// CauseBudget: the tenant's connection-time budget (Plan.Budget) was
	// spent; RetryAfter is when it allows a call.
	CauseBudget
)

func (e *OverLimitError) Error() string {
	who := fmt.Sprintf("tenant %q", e.Tenant)
	if e.Class != "" {
		who += fmt.Sprintf(" class %q", e.Class)
	}
	if e.Cause == CauseBudget {
		return fmt.Sprintf("%s over its connection-time budget; retry after %v", who, e.RetryAfter.Round(time.Millisecond))
	}
	if e.Waited > 0 {
		return fmt.Sprintf("%s over its limit of %d connections: waited %v; retry after %v",
			who, e.Limit, e.Waited.Round(time.Millisecond), e.RetryAfter.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s over its limit of %d connections; retry after %v",
		who, e.Limit, e.RetryAfter.Round(time.Millisecond))
}

// Is makes errors.Is(err, ErrOverLimit) true, and errors.Is(err,
// ErrOverBudget) for a request its budget refused.
func (e *OverLimitError) Is(target error) bool {
	return target == ErrOverLimit || target == ErrOverBudget && e.Cause == CauseBudget
}

// Stage names where a request waited for admission.
type Stage string

const (
	// StageTenant is the wait in the tenant's own queue, for a slot under its cap.
	StageTenant Stage = "tenant queue"
	// StageCluster is the wait for a cluster-wide slot from Config.Cluster.
	StageCluster Stage = "cluster"
	// StageShared is the wait for the Gate's shared capacity.
	StageShared Stage = "shared pool"
)

// WaitError reports a request whose context ended while it waited for
// admission. It unwraps to the context's error, so errors.Is(err,
// context.DeadlineExceeded) and errors.Is(err, context.Canceled) hold.
type WaitError struct {
	// Tenant is the tenant whose request gave up.
	Tenant string
	// Class is the request's class (WithClass), empty for the default class.
	Class string
	// Stage is where the request was waiting when its context ended.
	Stage Stage
	// Waited is how long it waited in all stages.
	Waited time.Duration
	// Err is the context's error.
	Err error
}

func (e *WaitError) Error() string {
	who := fmt.Sprintf("tenant %q", e.Tenant)
	if e.Class != "" {
		who += fmt.Sprintf(" class %q", e.Class)
	}
	return fmt.Sprintf("pool: %s: gave up waiting in the %s after %v: %v",
		who, e.Stage, e.Waited.Round(time.Microsecond), e.Err)
}

// Unwrap returns the context's error.
func (e *WaitError) Unwrap() error { return e.Err }
