package tracing_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tracing"
)

// A service sending its traces to a local Jaeger (OTLP on localhost:4317),
// with per-tenant metrics on the global MeterProvider and leak detection.
func Example() {
	ctx := context.Background()
	tp, shutdown, err := tracing.SetupOTLP(ctx, tracing.OTLPConfig{ServiceName: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	defer shutdown(context.Background()) // flushes the last spans

	tr := tracing.New(
		tracing.WithTracerProvider(tp),
		tracing.WithPoolName("orders"),
		tracing.WithCardinality(tracing.TopTenants(10, 100)),
		tracing.WithLeakDetection(30*time.Second),
	)
	pgxCfg, err := pgxpool.ParseConfig("postgres://app@localhost/orders")
	if err != nil {
		log.Fatal(err)
	}
	p, err := tenantdb.New(ctx, pgxCfg, tenantdb.Config{Tracer: tr})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	stop, err := tr.ObservePool(p)
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	// In a handler, under the request's span (otelhttp's, say):
	ctx = tenantdb.WithTenant(ctx, "acme")
	if _, err := p.Exec(ctx, "select 1"); err != nil {
		log.Print(err)
	}
}

// Metrics for Prometheus to scrape at /metrics; the shipped rules and
// dashboard are in the directory prometheus/ beside this package.
func ExampleNewPrometheusExporter() {
	ctx := context.Background()
	pe, err := tracing.NewPrometheusExporter(tracing.PrometheusConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer pe.Shutdown(context.Background())

	tr := tracing.New(tracing.WithMeterProvider(pe.MeterProvider()), tracing.WithPoolName("orders"))
	pgxCfg, err := pgxpool.ParseConfig("postgres://app@localhost/orders")
	if err != nil {
		log.Fatal(err)
	}
	p, err := tenantdb.New(ctx, pgxCfg, tenantdb.Config{Tracer: tr})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	stop, err := tr.ObservePool(p) // the gauges are read at each scrape
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	http.Handle("/metrics", pe.Handler())
}

// Spans and metrics over OTLP to an OpenTelemetry Collector.
func ExampleStartOTLP() {
	ctx := context.Background()
	o, err := tracing.StartOTLP(ctx, tracing.OTLPConfig{
		ServiceName:    "orders",
		Endpoint:       "otel-collector:4317",
		MetricInterval: 15 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer o.Shutdown(context.Background()) // flushes the last spans and metrics

	tr := tracing.New(append(o.Options(), tracing.WithPoolName("orders"))...)
	_ = tr // tenantdb.Config{Tracer: tr}, then tr.ObservePool, as in the package example
}
