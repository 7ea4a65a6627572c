package pool

import (
	"context"
	"time"
)

// AcquireTracer observes admissions. TraceAcquireStart is called before the
// request touches the Gate's lock; the context it returns is passed to
// TraceAcquireEnd and, when the permit is granted, to TraceRelease. Both are
// called outside any lock, from the acquiring goroutine.
type AcquireTracer interface {
	TraceAcquireStart(ctx context.Context, g *Gate, data TraceAcquireStartData) context.Context
	TraceAcquireEnd(ctx context.Context, g *Gate, data TraceAcquireEndData)
}

// ReleaseTracer is optionally implemented by a Config.Tracer to observe
// releases. TraceRelease is called outside any lock, from the releasing
// goroutine, with the context TraceAcquireStart returned.
type ReleaseTracer interface {
	TraceRelease(ctx context.Context, g *Gate, data TraceReleaseData)
}

// TraceAcquireStartData is what is known before admission.
type TraceAcquireStartData struct {
	Tenant string
}

// Outcome is how an admission ended.
type Outcome uint8

const (
	// Acquired: the permit was granted.
	Acquired Outcome = iota
	// Rejected: the tenant was at its cap and its queue was full.
	Rejected
	// TimedOut: the caller's deadline, or the plan's MaxWait, ran out while waiting.
	TimedOut
	// Cancelled: the caller's context was cancelled while waiting.
	Cancelled
	// Failed: any other error (invalid tenant, Lookup error, closed gate, too many tenants).
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case Rejected:
		return "rejected"
	case TimedOut:
		return "timed_out"
	case Cancelled:
		return "cancelled"
	default:
		return "failed"
	}
}

// TraceAcquireEndData describes a finished admission.
type TraceAcquireEndData struct {
	Tenant string
	// Class is the request's class (WithClass), empty for the default class
	// and for a request whose class is unknown (ErrUnknownClass).
	Class string
	// Plan is the tenant's plan; empty when the request failed before the
	// tenant was resolved, and for a tenant the Gate did not yet track whose
	// context had ended on arrival: a tracer measures a tenant only with it.
	Plan string
	// Limit and InUse are the tenant's cap and permits held when the request
	// arrived; EffectiveLimit its effective limit then (Limit unless
	// Config.Adaptive lowered it). For a request of a named class, they are
	// the class's cap for the tenant and its permits of the class.
	Limit, EffectiveLimit, InUse int
	// Position is the request's place in line on arrival: 0 when it was served
	// without waiting, n when n-1 of the tenant's requests were ahead of it.
	Position int
	// TenantWait is the time spent waiting for the tenant's own cap,
	// GlobalWait the time spent waiting for global capacity after that;
	// with ClusterWait they add up to the request's whole wait.
	TenantWait, GlobalWait time.Duration
	// ClusterWait is the time spent taking a cluster-wide slot (a round trip
	// at least), 0 without Config.Cluster. ClusterLocal reports that the
	// cluster store was unavailable and the slot is enforced by this process
	// only (fail open).
	ClusterWait  time.Duration
	ClusterLocal bool
	// Budgeted reports that the tenant's plan has a Budget, or the
	// request's class has one (Class.Budget), which took part in the
	// decision (Err is an *OverLimitError with CauseBudget when it refused
	// the request); BudgetLeft is then what was left right after, as
	// TenantStat.BudgetLeft (the smaller of the two with both).
	Budgeted   bool
	BudgetLeft time.Duration
	Outcome    Outcome
	// Err is the error returned to the caller, nil when Outcome is Acquired.
	Err error
}

// TraceReleaseData describes a released permit.
type TraceReleaseData struct {
	Tenant, Plan string
	// Class is the permit's class, empty for the default class.
	Class string
	// Hold is how long the permit was held.
	Hold time.Duration
	// Budgeted reports that the hold was charged to its tenant's Budget
	// (a class's Budget alone does not set it: the tenant's budget
	// metrics are of the tenant's own bucket).
	Budgeted bool
}
