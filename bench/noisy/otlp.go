package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/tenantdb/tenantdb/tracing"
	"github.com/tenantdb/tenantdb/tracing/otelsetup"
)

// otlpTracing sends the run's spans to an OTLP/gRPC endpoint (Jaeger's
// 4317). The demo has no request spans of its own, so every admission and
// query starts a root span: in Jaeger, service "tenantdb-noisy", search by
// the tag tenantdb.tenant.id=noisy or quiet.
func otlpTracing(ctx context.Context, endpoint string) ([]tracing.Option, func(), error) {
	o, err := otelsetup.StartOTLP(ctx, otelsetup.OTLPConfig{
		Endpoint: endpoint, Protocol: otelsetup.ProtocolGRPC, ServiceName: "tenantdb-noisy", NoMetrics: true,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("-otlp: %w", err)
	}
	return append(o.Options(), tracing.WithRootSpans()), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := o.Shutdown(ctx); err != nil {
			progress("flushing spans to %s: %v", endpoint, err)
		}
	}, nil
}

// serveMetrics serves the run's metrics for Prometheus at
// http://addr/metrics while it lasts: the pool and per-tenant gauges of the
// tenantdb scenarios, their rejections and waits, and every query's
// db.client.operation.duration. tracing/prometheus/ has rules and a
// dashboard for them.
func serveMetrics(addr string) ([]tracing.Option, func(), error) {
	pe, err := otelsetup.NewPrometheusExporter(otelsetup.PrometheusConfig{})
	if err != nil {
		return nil, nil, fmt.Errorf("-metrics: %w", err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		_ = pe.Shutdown(context.Background())
		return nil, nil, fmt.Errorf("-metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", pe.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			progress("-metrics: %v", err)
		}
	}()
	progress("metrics for Prometheus at http://%s/metrics", l.Addr())
	return []tracing.Option{tracing.WithMeterProvider(pe.MeterProvider())}, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
		_ = pe.Shutdown(ctx)
	}, nil
}
