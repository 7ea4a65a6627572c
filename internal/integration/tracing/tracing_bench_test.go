package tracing_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tracing"
)

// benchCase is one level of instrumentation: off (no Tracer), on with the
// request not sampled, on and sampled, and sampled with leak detection. The
// providers are the SDK's, exporting nowhere, so what is measured is the
// Tracer and the SDK's work per request, not an exporter.
type benchCase struct {
	name string
	opts []tracing.Option
	off  bool
	ctx  func(tp *sdktrace.TracerProvider) context.Context
}

func benchCases() []benchCase {
	unsampled := func(*sdktrace.TracerProvider) context.Context {
		return trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, // not sampled upstream
		}))
	}
	sampled := func(tp *sdktrace.TracerProvider) context.Context {
		ctx, _ := tp.Tracer("bench").Start(context.Background(), "request")
		return ctx
	}
	return []benchCase{
		{name: "off", off: true, ctx: func(*sdktrace.TracerProvider) context.Context { return context.Background() }},
		{name: "unsampled", ctx: unsampled},
		{name: "sampled", ctx: sampled},
		{name: "sampled+leakdetection", ctx: sampled, opts: []tracing.Option{tracing.WithLeakDetection(time.Hour)}},
	}
}

func benchProviders(b *testing.B) (*sdktrace.TracerProvider, *sdkmetric.MeterProvider) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return tp, mp
}

// BenchmarkGateAcquireRelease measures one uncontended Acquire and Release
// on a bare pool.Gate at each level of instrumentation.
func BenchmarkGateAcquireRelease(b *testing.B) {
	for _, c := range benchCases() {
		b.Run(c.name, func(b *testing.B) {
			tp, mp := benchProviders(b)
			cfg := pool.Config{Capacity: 20, Plans: map[string]pool.Plan{"p": {MaxConns: 10}}}
			if !c.off {
				cfg.Tracer = tracing.New(append([]tracing.Option{
					tracing.WithTracerProvider(tp), tracing.WithMeterProvider(mp),
				}, c.opts...)...)
			}
			g, err := pool.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			ctx := c.ctx(tp)
			b.ReportAllocs()
			for b.Loop() {
				p, err := g.Acquire(ctx, "acme")
				if err != nil {
					b.Fatal(err)
				}
				p.Release()
			}
		})
	}
}

// BenchmarkExecSelect1 measures Exec("select 1") through tenantdb against
// PostgreSQL at each level of instrumentation: admission and query spans,
// and the metrics.
func BenchmarkExecSelect1(b *testing.B) {
	for _, c := range benchCases() {
		b.Run(c.name, func(b *testing.B) {
			tp, mp := benchProviders(b)
			var tr *tracing.Tracer
			if !c.off {
				tr = tracing.New(append([]tracing.Option{
					tracing.WithTracerProvider(tp), tracing.WithMeterProvider(mp),
				}, c.opts...)...)
			}
			p := newTracedPool(b, tr, nil, 4, tenantdb.Config{})
			ctx := tenantdb.WithTenant(c.ctx(tp), "acme")
			if _, err := p.Exec(ctx, "select 1"); err != nil { // connect and prepare outside the loop
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Exec(ctx, "select 1"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
