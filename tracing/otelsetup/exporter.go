package otelsetup

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// exporterOptions names the option constructors of one OTLP exporter
// package; each of the four packages has the same four, on a type of its own.
type exporterOptions[O any] struct {
	endpointURL func(string) O
	endpoint    func(string) O
	insecure    func() O
	headers     func(map[string]string) O
}

var (
	traceGRPC  = exporterOptions[otlptracegrpc.Option]{otlptracegrpc.WithEndpointURL, otlptracegrpc.WithEndpoint, otlptracegrpc.WithInsecure, otlptracegrpc.WithHeaders}
	traceHTTP  = exporterOptions[otlptracehttp.Option]{otlptracehttp.WithEndpointURL, otlptracehttp.WithEndpoint, otlptracehttp.WithInsecure, otlptracehttp.WithHeaders}
	metricGRPC = exporterOptions[otlpmetricgrpc.Option]{otlpmetricgrpc.WithEndpointURL, otlpmetricgrpc.WithEndpoint, otlpmetricgrpc.WithInsecure, otlpmetricgrpc.WithHeaders}
	metricHTTP = exporterOptions[otlpmetrichttp.Option]{otlpmetrichttp.WithEndpointURL, otlpmetrichttp.WithEndpoint, otlpmetrichttp.WithInsecure, otlpmetrichttp.WithHeaders}
)

// of returns the options that send to tg: its endpoint (none leaves it to
// the exporter's environment variables), clear text if tg says so, and its
// headers.
func (e exporterOptions[O]) of(tg otlpTarget) []O {
	var opts []O
	switch {
	case tg.isURL:
		opts = append(opts, e.endpointURL(tg.endpoint))
	case tg.endpoint != "":
		opts = append(opts, e.endpoint(tg.endpoint))
	}
	if tg.insecure {
		opts = append(opts, e.insecure())
	}
	if len(tg.headers) > 0 {
		opts = append(opts, e.headers(tg.headers))
	}
	return opts
}

// newSpanExporter makes StartOTLP's span exporter.
func newSpanExporter(ctx context.Context, cfg OTLPConfig) (sdktrace.SpanExporter, error) {
	tg, err := resolveOTLPTarget(cfg, "TRACES", cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	if tg.protocol == ProtocolGRPC {
		exp, err = otlptracegrpc.New(ctx, traceGRPC.of(tg)...)
	} else {
		exp, err = otlptracehttp.New(ctx, traceHTTP.of(tg)...)
	}
	if err != nil {
		return nil, fmt.Errorf("otelsetup: OTLP %s exporter for %q: %w", tg.protocol, tg.endpoint, err)
	}
	return exp, nil
}

// newMetricExporter makes StartOTLP's metric exporter, with the same
// protocol, TLS rule and headers as its span exporter. Temporality is the
// SDK's default, cumulative, which is what Prometheus' OTLP receiver takes.
func newMetricExporter(ctx context.Context, cfg OTLPConfig) (sdkmetric.Exporter, error) {
	endpoint, err := metricsEndpoint(cfg)
	if err != nil {
		return nil, err
	}
	tg, err := resolveOTLPTarget(cfg, "METRICS", endpoint)
	if err != nil {
		return nil, err
	}
	var exp sdkmetric.Exporter
	if tg.protocol == ProtocolGRPC {
		exp, err = otlpmetricgrpc.New(ctx, metricGRPC.of(tg)...)
	} else {
		exp, err = otlpmetrichttp.New(ctx, metricHTTP.of(tg)...)
	}
	if err != nil {
		return nil, fmt.Errorf("otelsetup: OTLP %s metric exporter for %q: %w", tg.protocol, tg.endpoint, err)
	}
	return exp, nil
}
