// Package otelsetup sets up the OpenTelemetry SDK providers and exporters
// that get the [tracing] package's spans and metrics to a backend:
// [StartOTLP] pushes spans and metrics over OTLP (to an OpenTelemetry
// Collector, Jaeger, Prometheus' OTLP receiver), [NewPrometheusExporter]
// serves metrics for Prometheus to scrape.
//
// It is a package of its own so that a program that only instruments, and
// brings its own providers, does not link the SDK, gRPC, protobuf or the
// Prometheus client: package tracing depends on the OpenTelemetry API only.
//
//	o, err := otelsetup.StartOTLP(ctx, otelsetup.OTLPConfig{ServiceName: "orders"})
//	if err != nil { ... }
//	defer o.Shutdown(context.Background())
//	tr := tracing.New(o.Options()...)
package otelsetup
