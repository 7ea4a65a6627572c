package tracing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
)

// TestAdmissionSpansAndMetricsForEveryOutcome drives a bare Gate through
// each outcome and checks the admission span of each, then the metrics all
// of them produced.
func TestAdmissionSpansAndMetricsForEveryOutcome(t *testing.T) {
	e := newEnv(t, tracing.WithCardinality(tracing.ByTenant(10)), tracing.WithPoolName("orders"))
	g := newGate(t, e.tr, pool.Config{
		Capacity: 2,
		Plans:    map[string]pool.Plan{"std": {MaxConns: 1, MaxWaiting: 1, MaxWait: 10 * time.Millisecond}},
	})
	ctx, root := e.root(context.Background())

	lastSpan := func(t *testing.T, outcome string) sdktrace.ReadOnlySpan {
		t.Helper()
		spans := e.ended(tracing.AcquireSpanName)
		if len(spans) == 0 {
			t.Fatal("no admission span")
		}
		s := spans[len(spans)-1]
		if got := mustAttr(t, s, tracing.OutcomeKey).AsString(); got != outcome {
			t.Fatalf("outcome %q, want %q; attributes %v", got, outcome, s.Attributes())
		}
		if s.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Fatalf("admission span's parent is %v, want the request's span", s.Parent().SpanID())
		}
		if got := mustAttr(t, s, semconv.DBClientConnectionPoolNameKey).AsString(); got != "orders" {
			t.Fatalf("pool name %q", got)
		}
		if s.SpanKind() != trace.SpanKindInternal {
			t.Fatalf("kind %v", s.SpanKind())
		}
		return s
	}

	// Acquired at once: no wait, first in line, nothing held before.
	a := mustAcquire(t, ctx, g, "a")
	s := lastSpan(t, "acquired")
	for key, want := range map[attribute.Key]attribute.Value{
		tracing.TenantKey:         attribute.StringValue("a"),
		tracing.PlanKey:           attribute.StringValue("std"),
		tracing.LimitKey:          attribute.IntValue(1),
		tracing.EffectiveLimitKey: attribute.IntValue(1),
		tracing.InUseKey:          attribute.IntValue(0),
		tracing.QueuePositionKey:  attribute.IntValue(0),
		tracing.TenantWaitKey:     attribute.Float64Value(0),
		tracing.GlobalWaitKey:     attribute.Float64Value(0),
	} {
		if got := mustAttr(t, s, key); got != want {
			t.Errorf("acquired: %s = %v, want %v", key, got.Emit(), want.Emit())
		}
	}
	if s.Status().Code != codes.Unset {
		t.Errorf("acquired: status %v", s.Status())
	}

	// Timed out after the plan's MaxWait over the cap.
	if _, err := g.Acquire(ctx, "a"); !errors.Is(err, pool.ErrOverLimit) {
		t.Fatalf("over the cap: %v", err)
	}
	s = lastSpan(t, "timed_out")
	if mustAttr(t, s, tracing.TenantWaitKey).AsFloat64() <= 0 || mustAttr(t, s, tracing.InUseKey).AsInt64() != 1 ||
		mustAttr(t, s, tracing.QueuePositionKey).AsInt64() != 1 {
		t.Errorf("timed out: %v", s.Attributes())
	}
	if s.Status().Code != codes.Error || mustAttr(t, s, semconv.ErrorTypeKey).AsString() != "timed_out" {
		t.Errorf("timed out: status %v, attributes %v", s.Status(), s.Attributes())
	}

	// Waits under the cap, then is served: its tenant wait is measured.
	waiterCtx, waiterSpan := e.root(context.Background())
	waiter := acquireAsync(waiterCtx, g, "a")
	tenantdbtest.Eventually(t, probeTimeout, "a's second request waits", tenantWaiting(g, "a", 1))

	// Rejected at once: the queue (MaxWaiting 1) is full.
	_, err := g.Acquire(ctx, "a")
	var over *pool.OverLimitError
	if !errors.As(err, &over) {
		t.Fatalf("queue full: %v", err)
	}
	s = lastSpan(t, "rejected")
	if s.Status().Code != codes.Error || s.Status().Description != err.Error() {
		t.Errorf("rejected: status %v", s.Status())
	}
	if got := mustAttr(t, s, tracing.RetryAfterKey).AsFloat64(); got != over.RetryAfter.Seconds() {
		t.Errorf("rejected: retry after %v, want %v", got, over.RetryAfter.Seconds())
	}
	if len(s.Events()) == 0 || s.Events()[0].Name != "exception" {
		t.Errorf("rejected: no exception event: %v", s.Events())
	}

	a.Release()
	r := recv(t, waiter)
	if r.err != nil {
		t.Fatal(r.err)
	}
	waiterSpan.End()
	s = e.ended(tracing.AcquireSpanName)[len(e.ended(tracing.AcquireSpanName))-1]
	if mustAttr(t, s, tracing.OutcomeKey).AsString() != "acquired" || mustAttr(t, s, tracing.TenantWaitKey).AsFloat64() <= 0 ||
		mustAttr(t, s, tracing.QueuePositionKey).AsInt64() != 1 {
		t.Errorf("waited for its cap: %v", s.Attributes())
	}

	// Waits for global capacity (b and a's waiter hold both units), then
	// is cancelled: only a global wait.
	b := mustAcquire(t, ctx, g, "b")
	cctx, cancel := context.WithCancel(ctx)
	c := acquireAsync(cctx, g, "c")
	tenantdbtest.Eventually(t, probeTimeout, "c waits for global capacity", tenantWaiting(g, "c", 1))
	cancel()
	if r := recv(t, c); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled: %v", r.err)
	}
	s = lastSpan(t, "cancelled")
	if mustAttr(t, s, tracing.GlobalWaitKey).AsFloat64() <= 0 || mustAttr(t, s, tracing.TenantWaitKey).AsFloat64() != 0 {
		t.Errorf("cancelled: %v", s.Attributes())
	}
	if s.Status().Code != codes.Error {
		t.Errorf("cancelled: status %v", s.Status())
	}

	// Failed: an invalid tenant, before anything about it is known.
	if _, err := g.Acquire(ctx, ""); !errors.Is(err, pool.ErrInvalidTenant) {
		t.Fatal(err)
	}
	s = lastSpan(t, "failed")
	if _, ok := attr(s, tracing.PlanKey); ok {
		t.Errorf("failed: plan set: %v", s.Attributes())
	}
	r.p.Release()
	b.Release()
	root.End()

	// Metrics: everything above, counted once.
	rm := e.collect(t)
	poolAttr := semconv.DBClientConnectionPoolName("orders")
	a1 := tracing.TenantKey.String("a")
	if got := value(t, rm, "tenantdb.tenant.connection.rejections", a1, tracing.OutcomeKey.String("rejected")).value; got != 1 {
		t.Errorf("rejections{a,rejected} = %v, want 1", got)
	}
	if got := value(t, rm, "tenantdb.tenant.connection.rejections", a1, tracing.OutcomeKey.String("timed_out")).value; got != 1 {
		t.Errorf("rejections{a,timed_out} = %v, want 1", got)
	}
	if got := value(t, rm, "db.client.connection.timeouts", poolAttr).value; got != 1 {
		t.Errorf("db.client.connection.timeouts = %v, want 1", got)
	}
	// Acquired: a, a's waiter, b.
	wait := value(t, rm, "db.client.connection.wait_time", poolAttr)
	if wait.value != 3 || wait.sum <= 0 {
		t.Errorf("db.client.connection.wait_time: count %v sum %v, want 3 and positive", wait.value, wait.sum)
	}
	if got := value(t, rm, "tenantdb.tenant.connection.wait_time", a1, tracing.OutcomeKey.String("acquired")).value; got != 2 {
		t.Errorf("tenant wait_time{a,acquired} count %v, want 2", got)
	}
	if got := value(t, rm, "tenantdb.tenant.connection.wait_time", tracing.TenantKey.String("c"), tracing.OutcomeKey.String("cancelled")); got.value != 1 || got.sum <= 0 {
		t.Errorf("tenant wait_time{c,cancelled}: %+v", got)
	}
	use := value(t, rm, "db.client.connection.use_time", poolAttr)
	if use.value != 3 || use.sum <= 0 {
		t.Errorf("db.client.connection.use_time: count %v sum %v, want 3 and positive", use.value, use.sum)
	}
	if got := value(t, rm, "tenantdb.tenant.connection.use_time", a1).value; got != 2 {
		t.Errorf("tenant use_time{a} count %v, want 2", got)
	}
	if m, _ := metricNamed(rm, "db.client.connection.wait_time"); m.Unit != "s" {
		t.Errorf("wait_time unit %q, want s", m.Unit)
	}
	if b := wait.hist.Bounds; len(b) == 0 || b[0] != 0.001 {
		t.Errorf("wait_time bounds %v, want seconds-scale boundaries", b)
	}
	// The invalid tenant reached no series.
	for _, p := range points(t, rm, "tenantdb.tenant.connection.wait_time") {
		if v, _ := p.attrs.Value(tracing.TenantKey); v.AsString() == "" {
			t.Errorf("a series for the invalid tenant: %v", p.attrs)
		}
	}
}

// TestNoSpanWithoutRecordingParent checks that an unsampled or untraced
// request gets no spans and costs no allocation in the hooks, but still
// counts in the metrics; and that WithRootSpans starts traces.
func TestNoSpanWithoutRecordingParent(t *testing.T) {
	e := newEnv(t)
	g := newGate(t, e.tr, pool.Config{Capacity: 4})

	unsampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, // TraceFlags: not sampled
	}))
	for _, ctx := range []context.Context{context.Background(), unsampled} {
		p := mustAcquire(t, ctx, g, "a")
		p.Release()
		if got := e.tr.TraceAcquireStart(ctx, g, pool.TraceAcquireStartData{Tenant: "a"}); got != ctx {
			t.Errorf("TraceAcquireStart wrapped a context it has nothing to add to")
		}
		allocs := testing.AllocsPerRun(100, func() {
			e.tr.TraceAcquireStart(ctx, g, pool.TraceAcquireStartData{Tenant: "a"})
		})
		if allocs != 0 {
			t.Errorf("TraceAcquireStart without a recording parent: %v allocations", allocs)
		}
		allocs = testing.AllocsPerRun(100, func() {
			qctx := e.tr.TraceQueryStart(ctx, nil, pgx.TraceQueryStartData{SQL: "select 1"})
			e.tr.TraceQueryEnd(qctx, nil, pgx.TraceQueryEndData{CommandTag: pgconn.NewCommandTag("SELECT 1")})
		})
		if allocs != 0 {
			t.Errorf("query hooks without a recording parent: %v allocations", allocs)
		}
	}
	if n := len(e.spans.Ended()); n != 0 {
		t.Fatalf("%d spans without a recording parent", n)
	}
	rm := e.collect(t)
	if got := value(t, rm, "db.client.connection.use_time").value; got != 2 {
		t.Errorf("use_time count %v, want 2: metrics do not depend on sampling", got)
	}

	roots := newEnv(t, tracing.WithRootSpans())
	g = newGate(t, roots.tr, pool.Config{Capacity: 4})
	p := mustAcquire(t, context.Background(), g, "a")
	p.Release()
	spans := roots.ended(tracing.AcquireSpanName)
	if len(spans) != 1 || spans[0].Parent().IsValid() {
		t.Fatalf("WithRootSpans: %d admission spans (want 1, a root)", len(spans))
	}
}

// TestSpanAttributesOption checks WithAttributes.
func TestSpanAttributesOption(t *testing.T) {
	e := newEnv(t, tracing.WithAttributes(attribute.String("deployment", "blue")))
	g := newGate(t, e.tr, pool.Config{Capacity: 4})
	ctx, root := e.root(context.Background())
	mustAcquire(t, ctx, g, "a").Release()
	root.End()
	if got := mustAttr(t, e.ended(tracing.AcquireSpanName)[0], "deployment").AsString(); got != "blue" {
		t.Fatalf("deployment = %q", got)
	}
}

// localOnly is a cluster limiter whose store is down in fail-open mode: it
// grants every slot on the process's own limits.
type localOnly struct{}

func (localOnly) AcquireSlot(context.Context, string, int, time.Duration) (pool.ClusterLease, error) {
	return localLease{}, nil
}

type localLease struct{}

func (localLease) Release()    {}
func (localLease) Local() bool { return true }

func TestAdmissionSpanShowsClusterFailOpen(t *testing.T) {
	e := newEnv(t)
	g := newGate(t, e.tr, pool.Config{Capacity: 2, Cluster: localOnly{}})
	ctx, root := e.root(context.Background())
	p, err := g.Acquire(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	p.Release()
	root.End()
	spans := e.ended(tracing.AcquireSpanName)
	if len(spans) != 1 {
		t.Fatalf("%d admission spans", len(spans))
	}
	if !mustAttr(t, spans[0], tracing.ClusterLocalKey).AsBool() {
		t.Fatal("a fail-open grant is not marked on its span")
	}
	mustAttr(t, spans[0], tracing.ClusterWaitKey)
}
