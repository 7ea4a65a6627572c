package tracing

import "go.opentelemetry.io/otel/attribute"

// ScopeName is the instrumentation scope of the Tracer's spans and metrics:
// the package's import path, as the OpenTelemetry guidelines ask.
const ScopeName = "github.com/tenantdb/tenantdb/tracing"

// Attribute keys the Tracer sets beside the semantic-convention ones. They
// are exported so that queries, views and tests need not repeat the strings.
// Durations are float64 seconds.
const (
	// TenantKey is the tenant: on admission, query and leak spans; on metrics
	// it is the tenant or "other", depending on the Cardinality.
	TenantKey = attribute.Key("tenantdb.tenant.id")
	// PlanKey is the tenant's plan: on admission spans, and on metrics
	// labelled ByPlan.
	PlanKey = attribute.Key("tenantdb.tenant.plan")
	// ClassKey is the request's workload class (pool.WithClass) on admission
	// spans, set only for a named class; on the per-class metrics it is
	// every class, "default" for work without one.
	ClassKey = attribute.Key("tenantdb.class")
	// LimitKey is the tenant's cap when the request arrived (for a request
	// of a named class, the class's cap for the tenant).
	LimitKey = attribute.Key("tenantdb.tenant.limit")
	// EffectiveLimitKey is the tenant's effective limit when the request
	// arrived: its cap, or its adaptive limit below it (tenantdb.Config.Adaptive).
	EffectiveLimitKey = attribute.Key("tenantdb.tenant.effective_limit")
	// InUseKey is what the tenant held when the request arrived.
	InUseKey = attribute.Key("tenantdb.tenant.in_use")
	// QueuePositionKey is the request's place in line on arrival: 0 when it
	// was served without waiting, n when n-1 of the tenant's requests were
	// ahead of it.
	QueuePositionKey = attribute.Key("tenantdb.queue.position")
	// TenantWaitKey is the time spent waiting under the tenant's own cap.
	TenantWaitKey = attribute.Key("tenantdb.wait.tenant_seconds")
	// GlobalWaitKey is the time spent waiting for global capacity after that.
	GlobalWaitKey = attribute.Key("tenantdb.wait.global_seconds")
	// ServerKey is the server (tenantdb.NewServers) on the per-server
	// metrics and on the per-database ones of a Pool with several servers.
	ServerKey = attribute.Key("tenantdb.server")
	// ClusterWaitKey is the time spent taking a cluster-wide slot
	// (tenantdb.Config.Cluster); set only when a cluster limiter is in use.
	ClusterWaitKey = attribute.Key("tenantdb.wait.cluster_seconds")
	// ClusterLocalKey is true when the cluster store was unavailable and the
	// slot was granted on this process's limits alone (fail open).
	ClusterLocalKey = attribute.Key("tenantdb.cluster.local")
	// OutcomeKey is how the admission ended: acquired, rejected, timed_out,
	// cancelled or failed (pool.Outcome's String).
	OutcomeKey = attribute.Key("tenantdb.outcome")
	// RetryAfterKey is the rejection's retry estimate (OverLimitError.RetryAfter).
	RetryAfterKey = attribute.Key("tenantdb.retry_after_seconds")
	// CauseKey is what refused a request, on the rejection counter and the
	// budget event: "cap" (its cap or queue, pool.CauseCap), "budget" (its
	// plan's Budget, pool.CauseBudget) or "deadline" (the caller's context
	// ended while it waited).
	CauseKey = attribute.Key("tenantdb.cause")
	// TimeLimitKey is the time limit that ended a tenant's work, on the
	// timeout counter: statement_timeout, idle_in_transaction or max_hold
	// (pool.TimeLimit's String).
	TimeLimitKey = attribute.Key("tenantdb.time_limit")
	// BudgetLeftKey is what was left of the tenant's connection-time budget
	// right after its admission was decided, on the budget event.
	BudgetLeftKey = attribute.Key("tenantdb.budget.left_seconds")
	// HoldKey is how long a permit has been held, on leak events.
	HoldKey = attribute.Key("tenantdb.hold_seconds")
	// LeakThresholdKey is the leak-detection threshold, on leak events.
	LeakThresholdKey = attribute.Key("tenantdb.leak.threshold_seconds")
)

// BudgetEventName names the admission span's event of a tenant whose plan
// has a Budget, which took part in the decision.
const BudgetEventName = "tenantdb.budget"

// Values of CauseKey.
const (
	CauseCap      = "cap"
	CauseBudget   = "budget"
	CauseDeadline = "deadline"
)

// OtherTenants is the tenant label of series that aggregate every tenant
// without a label of its own (see Cardinality).
const OtherTenants = "other"
