package tracing

import (
	"context"
	"log/slog"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/pool"
)

// Tracer is tenantdb's OpenTelemetry instrumentation. It implements
// pool.AcquireTracer, pool.ReleaseTracer and pool.TimeLimitTracer (admission
// spans, metrics and leak detection) and pgx's QueryTracer, BatchTracer, CopyFromTracer,
// PrepareTracer and ConnectTracer (query spans). Give it to
// tenantdb.Config.Tracer, or to pool.Config.Tracer for a bare Gate. It is
// safe for concurrent use. One Tracer serves one pool: its metrics carry one
// pool name.
type Tracer struct {
	cfg    config
	tracer trace.Tracer
	meter  metric.Meter // made the instruments; ObservePool registers its callbacks with it
	labels *labeler

	spanAttrs []attribute.KeyValue // on every span: the pool name and WithAttributes
	poolAdd   []metric.AddOption
	poolRec   []metric.RecordOption
	poolObs   []metric.ObserveOption
	poolAttrs []attribute.KeyValue   // the pool name
	usedObs   []metric.ObserveOption // pool name, state=used
	idleObs   []metric.ObserveOption // pool name, state=idle

	instruments

	mu        sync.Mutex
	observing bool // guarded by mu: a pool's callbacks are registered
}

// Interfaces the Tracer implements; checked here so that a signature change
// in pool or pgx breaks the build rather than silently dropping a hook.
var (
	_ pool.AcquireTracer   = (*Tracer)(nil)
	_ pool.ReleaseTracer   = (*Tracer)(nil)
	_ pool.TimeLimitTracer = (*Tracer)(nil)
	_ pgx.QueryTracer      = (*Tracer)(nil)
	_ pgx.BatchTracer      = (*Tracer)(nil)
	_ pgx.CopyFromTracer   = (*Tracer)(nil)
	_ pgx.PrepareTracer    = (*Tracer)(nil)
	_ pgx.ConnectTracer    = (*Tracer)(nil)
)

// New returns a Tracer on the providers given by [WithTracerProvider] and
// [WithMeterProvider], or on otel's global ones, as otelpgx and otelhttp do:
// those are no-op until the program installs its own, before or after New.
// Its instruments are created here, once; an error creating one (which the
// SDK reports only for invalid names or units, so never in practice) is
// logged to the Tracer's logger and leaves that instrument a no-op.
func New(opts ...Option) *Tracer {
	cfg := newConfig(opts)
	if cfg.tracerProvider == nil {
		cfg.tracerProvider = otel.GetTracerProvider()
	}
	if cfg.meterProvider == nil {
		cfg.meterProvider = otel.GetMeterProvider()
	}
	t := &Tracer{
		cfg:    cfg,
		tracer: cfg.tracerProvider.Tracer(ScopeName),
		meter:  cfg.meterProvider.Meter(ScopeName),
	}
	poolName := semconv.DBClientConnectionPoolName(cfg.poolName)
	t.spanAttrs = append([]attribute.KeyValue{poolName}, cfg.attrs...)
	t.labels = newLabeler(cfg.cardinality, []attribute.KeyValue{poolName})
	poolSet := attribute.NewSet(poolName)
	t.poolAttrs = []attribute.KeyValue{poolName}
	t.poolAdd = []metric.AddOption{metric.WithAttributeSet(poolSet)}
	t.poolRec = []metric.RecordOption{metric.WithAttributeSet(poolSet)}
	t.poolObs = []metric.ObserveOption{metric.WithAttributeSet(poolSet)}
	t.usedObs = []metric.ObserveOption{metric.WithAttributes(poolName, semconv.DBClientConnectionStateUsed)}
	t.idleObs = []metric.ObserveOption{metric.WithAttributes(poolName, semconv.DBClientConnectionStateIdle)}

	if err := t.instruments.create(t.meter); err != nil {
		t.logger().Error("tenantdb: creating the tracing instruments", slog.Any("error", err))
	}
	return t
}

// startSpan starts a span as a child of ctx's span when that one is recording,
// or as a root when WithRootSpans is set; otherwise it returns nil and does
// nothing, which is the whole cost of tracing an unsampled request.
func (t *Tracer) startSpan(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !t.cfg.rootSpans && !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil
	}
	all := make([]attribute.KeyValue, 0, len(t.spanAttrs)+len(attrs))
	all = append(append(all, t.spanAttrs...), attrs...)
	sctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(all...))
	if !span.IsRecording() {
		return ctx, nil // a root the sampler dropped
	}
	return sctx, span
}

// Cardinality returns the Tracer's Cardinality.
func (t *Tracer) Cardinality() Cardinality { return t.labels.card }
