package tracing

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenantdb/tenantdb/pool"
)

// AcquireSpanName is the name of admission spans.
const AcquireSpanName = "tenantdb.acquire"

// admission is the state of one traced acquire. It is the context
// TraceAcquireStart returns, which the Gate hands back to TraceAcquireEnd
// and, for a granted permit, to TraceRelease: embedding the caller's context
// instead of wrapping it with context.WithValue saves an allocation, and the
// hooks find it with a type assertion instead of a Value walk.
type admission struct {
	context.Context            // the caller's
	span            trace.Span // nil when the acquire is not traced
	// leak is set by TraceAcquireEnd when the permit was granted and leak
	// detection is on; read by TraceRelease, which the Gate calls only after
	// Acquire (and so TraceAcquireEnd) has returned.
	leak *leakWatch
}

type admissionKey struct{}

// Value makes the admission findable under other tracers' wrappers.
func (a *admission) Value(key any) any {
	if key == (admissionKey{}) {
		return a
	}
	return a.Context.Value(key)
}

func admissionFrom(ctx context.Context) *admission {
	if a, ok := ctx.(*admission); ok {
		return a
	}
	if ctx == nil {
		return nil
	}
	a, _ := ctx.Value(admissionKey{}).(*admission)
	return a
}

// TraceAcquireStart starts the admission span when ctx's span is recording
// (or WithRootSpans is set). When neither a span nor leak detection needs
// state, it returns ctx as it is and allocates nothing.
func (t *Tracer) TraceAcquireStart(ctx context.Context, g *pool.Gate, data pool.TraceAcquireStartData) context.Context {
	var attrs []attribute.KeyValue
	if kv, ok := tenantAttr(data.Tenant); ok {
		attrs = []attribute.KeyValue{kv}
	}
	_, span := t.startSpan(ctx, AcquireSpanName, trace.SpanKindInternal, attrs...)
	if span == nil && t.cfg.leakThreshold == 0 {
		return ctx
	}
	return &admission{Context: ctx, span: span}
}

// TraceAcquireEnd records the admission's metrics, ends its span with what
// the Gate measured and, for a granted permit under leak detection, starts
// watching it.
func (t *Tracer) TraceAcquireEnd(ctx context.Context, g *pool.Gate, d pool.TraceAcquireEndData) {
	t.recordAcquire(ctx, d)
	a := admissionFrom(ctx)
	if a == nil {
		return
	}
	if a.span != nil {
		endAcquireSpan(a.span, d)
	}
	if d.Outcome == pool.Acquired && t.cfg.leakThreshold > 0 {
		a.leak = t.watch(a.Context, d)
	}
}

// TraceRelease records the permit's use time (and, for a tenant with a
// budget, its charge in tenantdb.tenant.budget.used) and, under leak detection,
// stops watching it, reporting its return if it had been reported as leaked.
func (t *Tracer) TraceRelease(ctx context.Context, g *pool.Gate, d pool.TraceReleaseData) {
	if ctx == nil {
		ctx = context.Background()
	}
	hold := d.Hold.Seconds()
	t.connUse.Record(ctx, hold, t.poolRec...)
	s := t.labels.forTenant(d.Tenant, d.Plan, false)
	t.tenantUse.Record(ctx, hold, s.rec...)
	if d.Budgeted {
		t.tenantBudgetUsed.Add(ctx, hold, s.add...)
	}
	if a := admissionFrom(ctx); a != nil && a.leak != nil {
		a.leak.release(d)
	}
}

func (t *Tracer) recordAcquire(ctx context.Context, d pool.TraceAcquireEndData) {
	if d.Outcome == pool.Failed || d.Plan == "" {
		// The Gate resolved no tenant (an invalid ID, a Lookup error, a
		// context that had ended before an unknown tenant's request came):
		// nothing to label, and a flood of such IDs must not reach the labels.
		return
	}
	wait := (d.TenantWait + d.GlobalWait + d.ClusterWait).Seconds()
	// The tenant's own pressure: refused at its cap, or queued behind it.
	hot := d.Outcome == pool.Rejected || d.Outcome == pool.TimedOut || d.TenantWait > 0
	s := t.labels.forTenant(d.Tenant, d.Plan, hot)
	t.tenantWait.Record(ctx, wait, s.recByOutc[d.Outcome]...)
	switch d.Outcome {
	case pool.Acquired:
		t.connWait.Record(ctx, wait, t.poolRec...)
	case pool.Rejected:
		t.tenantRejections.Add(ctx, 1, s.refusals[0][refusalCause(d.Err)]...)
	case pool.TimedOut:
		t.connTimeouts.Add(ctx, 1, t.poolAdd...)
		t.tenantRejections.Add(ctx, 1, s.refusals[1][refusalCause(d.Err)]...)
	}
}

// refusalCause is the index in causes of what refused a request with err.
func refusalCause(err error) int {
	var over *pool.OverLimitError
	switch {
	case errors.As(err, &over) && over.Cause == pool.CauseBudget:
		return 1
	case over != nil:
		return 0
	}
	return 2 // the caller's context ended while it waited
}

// TraceTimeLimit counts work ended by one of its tenant's time limits
// (pool.Permit.Exceeded) in tenantdb.tenant.timeouts, by TimeLimitKey. A
// tenant's timeouts are its own pressure: under TopTenants they earn it a
// label.
func (t *Tracer) TraceTimeLimit(ctx context.Context, g *pool.Gate, d pool.TraceTimeLimitData) {
	if int(d.Limit) >= numTimeLimits {
		return
	}
	t.tenantTimeouts.Add(ctx, 1, t.labels.forTenant(d.Tenant, d.Plan, true).timeouts[d.Limit]...)
}

func endAcquireSpan(span trace.Span, d pool.TraceAcquireEndData) {
	// One SetAttributes call: the SDK grows and deduplicates the span's
	// attributes on each.
	attrs := make([]attribute.KeyValue, 0, 14)
	if d.Plan != "" { // empty when the request failed before the tenant was resolved
		attrs = append(attrs, PlanKey.String(d.Plan), LimitKey.Int(d.Limit),
			EffectiveLimitKey.Int(d.EffectiveLimit), InUseKey.Int(d.InUse))
	}
	if d.Class != "" {
		attrs = append(attrs, ClassKey.String(d.Class))
	}
	attrs = append(attrs,
		QueuePositionKey.Int(d.Position),
		TenantWaitKey.Float64(d.TenantWait.Seconds()),
		GlobalWaitKey.Float64(d.GlobalWait.Seconds()),
		OutcomeKey.String(d.Outcome.String()),
	)
	if d.ClusterWait > 0 || d.ClusterLocal {
		attrs = append(attrs, ClusterWaitKey.Float64(d.ClusterWait.Seconds()), ClusterLocalKey.Bool(d.ClusterLocal))
	}
	if d.Err != nil {
		var over *pool.OverLimitError
		if errors.As(d.Err, &over) {
			attrs = append(attrs, RetryAfterKey.Float64(over.RetryAfter.Seconds()))
		}
		attrs = append(attrs, semconv.ErrorTypeKey.String(d.Outcome.String()))
	}
	span.SetAttributes(attrs...)
	if d.Budgeted {
		// The budget's part in the decision: what it left, and whether it
		// refused the request.
		ev := []attribute.KeyValue{OutcomeKey.String(d.Outcome.String()), BudgetLeftKey.Float64(d.BudgetLeft.Seconds())}
		if d.Outcome == pool.Rejected || d.Outcome == pool.TimedOut {
			ev = append(ev, CauseKey.String(causes[refusalCause(d.Err)]))
		}
		span.AddEvent(BudgetEventName, trace.WithAttributes(ev...))
	}
	if d.Err != nil {
		span.RecordError(d.Err)
		span.SetStatus(codes.Error, d.Err.Error())
	}
	span.End()
}
