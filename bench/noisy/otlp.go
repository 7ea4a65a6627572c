package main

import (
	"context"
	"fmt"
	"time"

	"github.com/tenantdb/tenantdb/tracing"
)

// otlpTracer sends the run's spans to an OTLP/gRPC endpoint (Jaeger's
// 4317). The demo has no request spans of its own, so every admission and
// query starts a root span: in Jaeger, service "tenantdb-noisy", search by
// the tag tenantdb.tenant.id=noisy or quiet.
func otlpTracer(ctx context.Context, endpoint string) (*tracing.Tracer, func(), error) {
	tp, shutdown, err := tracing.SetupOTLP(ctx, tracing.OTLPConfig{
		Endpoint: endpoint, Protocol: tracing.ProtocolGRPC, ServiceName: "tenantdb-noisy",
	})
	if err != nil {
		return nil, nil, fmt.Errorf("-otlp: %w", err)
	}
	tr := tracing.New(tracing.WithTracerProvider(tp), tracing.WithRootSpans())
	return tr, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			progress("flushing spans to %s: %v", endpoint, err)
		}
	}, nil
}
