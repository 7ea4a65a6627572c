package tracing_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tracing"
)

// TestDefaultProvidersAreTheGlobalOnes installs recording providers as
// otel's global ones: a Tracer made without provider options records its
// admission span and metrics there, as otelpgx does (issue 32 item 1); one
// given other providers records nothing there. (A Tracer made before the
// first global provider is set follows it through otel's delegation; other
// tests of this process set one before, so that is not tested here.)
func TestDefaultProvidersAreTheGlobalOnes(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	t.Cleanup(func() {
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	recorded := func(t *testing.T, tr *tracing.Tracer) (nspans, nmetrics int) {
		t.Helper()
		spans.Reset()
		g := newGate(t, tr, pool.Config{
			Capacity: 1, Plans: map[string]pool.Plan{"std": {MaxConns: 1}},
		})
		mustAcquire(t, context.Background(), g, "acme").Release()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatalf("collect: %v", err)
		}
		for _, sm := range rm.ScopeMetrics {
			if sm.Scope.Name == tracing.ScopeName {
				nmetrics += len(sm.Metrics)
			}
		}
		return len(spans.Ended()), nmetrics
	}

	if n, m := recorded(t, tracing.New(tracing.WithRootSpans())); n != 1 || m == 0 {
		t.Errorf("New without providers: %d spans and %d metrics on otel's global providers, want the admission span and its metrics", n, m)
	}
	own := tracing.New(tracing.WithRootSpans(), tracing.WithTracerProvider(tracenoop.NewTracerProvider()),
		tracing.WithMeterProvider(metricnoop.NewMeterProvider()))
	if n, _ := recorded(t, own); n != 0 {
		t.Errorf("New given other providers: %d spans on otel's global providers, want none", n)
	}
}
