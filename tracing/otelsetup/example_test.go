package otelsetup_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tracing"
	"github.com/tenantdb/tenantdb/tracing/otelsetup"
)

// Spans only, to a local Jaeger (OTLP/gRPC on localhost:4317, in clear
// text since it is loopback); Jaeger takes no metrics.
func ExampleStartOTLP_jaeger() {
	o, err := otelsetup.StartOTLP(context.Background(), otelsetup.OTLPConfig{ServiceName: "orders", NoMetrics: true})
	if err != nil {
		log.Fatal(err)
	}
	defer o.Shutdown(context.Background()) // flushes the last spans

	tr := tracing.New(append(o.Options(), tracing.WithPoolName("orders"))...)
	_ = tr // tenantdb.Config{Tracer: tr}
}

// Spans and metrics over OTLP to an OpenTelemetry Collector.
func ExampleStartOTLP() {
	ctx := context.Background()
	o, err := otelsetup.StartOTLP(ctx, otelsetup.OTLPConfig{
		ServiceName:    "orders",
		Endpoint:       "otel-collector:4317",
		MetricInterval: 15 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer o.Shutdown(context.Background()) // flushes the last spans and metrics

	tr := tracing.New(append(o.Options(), tracing.WithPoolName("orders"))...)
	_ = tr // tenantdb.Config{Tracer: tr}, then tr.ObservePool, as in the tracing package's example
}

// Metrics for Prometheus to scrape at /metrics; the shipped rules and
// dashboard are in the directory tracing/prometheus/ of this repository.
func ExampleNewPrometheusExporter() {
	ctx := context.Background()
	pe, err := otelsetup.NewPrometheusExporter(otelsetup.PrometheusConfig{})
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
