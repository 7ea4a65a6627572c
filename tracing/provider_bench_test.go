package tracing_test

import (
	"context"
	"testing"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tracing"
)

// BenchmarkDefaultProviders measures what New's default, otel's global
// providers while no program has installed any, costs an admission next to
// explicit no-op providers, with no tracer as the reference.
func BenchmarkDefaultProviders(b *testing.B) {
	for _, bc := range []struct {
		name   string
		tracer func() *tracing.Tracer
	}{
		{"no-tracer", func() *tracing.Tracer { return nil }},
		{"explicit-noop", func() *tracing.Tracer {
			return tracing.New(tracing.WithTracerProvider(tracenoop.NewTracerProvider()),
				tracing.WithMeterProvider(metricnoop.NewMeterProvider()))
		}},
		{"global-noop", func() *tracing.Tracer { return tracing.New() }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := pool.Config{Capacity: 4}
			if tr := bc.tracer(); tr != nil {
				cfg.Tracer = tr
			}
			g, err := pool.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			ctx := context.Background()
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
