package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tenantdb/tenantdb/tracing"
)

// OTLP protocols for OTLPConfig.Protocol.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// OTLPConfig configures StartOTLP. Zero values mean the documented
// defaults; the usual OTEL_EXPORTER_OTLP_* environment variables apply where
// a field is left empty.
type OTLPConfig struct {
	// Endpoint is where spans (and, unless MetricsEndpoint says otherwise,
	// metrics) go: host:port (localhost:4317), or a URL
	// (http://jaeger:4318, https://collector.example.com:4317; for HTTP a
	// URL's path, if it has one, replaces /v1/traces). Default: the
	// environment's OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT,
	// else localhost:4317 for gRPC and localhost:4318 for HTTP, which is
	// where a local Jaeger listens.
	Endpoint string

	// Protocol is ProtocolGRPC ("grpc") or ProtocolHTTP ("http/protobuf";
	// "http" is accepted). Default: OTEL_EXPORTER_OTLP_PROTOCOL, else gRPC.
	Protocol string

	// ServiceName is the service.name resource attribute, what Jaeger lists
	// services by. Default: OTEL_SERVICE_NAME, else the SDK's
	// "unknown_service:" and the executable's name.
	ServiceName string

	// Insecure sends without TLS. Without it, a URL's scheme decides, and
	// host:port gets TLS unless the host is loopback (localhost,
	// 127.0.0.0/8, ::1): a local Jaeger works with no setting, and a remote
	// collector is not sent spans in clear text by accident.
	Insecure bool

	// Headers are sent with every export, e.g. a collector's API key.
	Headers map[string]string

	// Sampler decides which traces are recorded. Default:
	// ParentBased(AlwaysSample()), which follows the caller's decision.
	Sampler sdktrace.Sampler

	// Attributes are added to the resource, after service.name.
	Attributes []attribute.KeyValue

	// NoGlobal leaves otel's global providers and propagator alone. By
	// default StartOTLP installs its providers as the global TracerProvider
	// and MeterProvider, and the W3C trace-context and baggage propagators
	// as the global propagator, so that the instrumentation that reads
	// them (otelhttp, otelgrpc, otelpgx, [tracing.New] without options)
	// joins the same traces: without that, a request's span is a no-op and
	// nothing under it is recorded. Set it where another part of the
	// program owns the globals; then pass the providers where needed
	// ([OTLP.Options]).
	NoGlobal bool

	// SetGlobal is what StartOTLP does by default now; it is kept so that
	// existing configurations compile, and has no effect.
	SetGlobal bool

	// NoTraces turns span export off, for a service that exports only
	// metrics this way.
	NoTraces bool

	// NoMetrics turns metric export off, for a service that exports metrics
	// otherwise ([NewPrometheusExporter]) or sends spans to Jaeger, which
	// takes no metrics.
	NoMetrics bool

	// MetricsEndpoint is where metrics go, in the form of Endpoint. Default:
	// the environment's OTEL_EXPORTER_OTLP_METRICS_ENDPOINT; else Endpoint,
	// with a URL's path /v1/traces (or none) made /v1/metrics for HTTP.
	MetricsEndpoint string

	// MetricInterval is how often metrics are collected and exported.
	// Default: OTEL_METRIC_EXPORT_INTERVAL, else one minute.
	MetricInterval time.Duration
}

// OTLP is what StartOTLP set up: the providers whose spans and metrics go
// to the collector.
type OTLP struct {
	// TracerProvider batches spans to the collector; nil with NoTraces.
	TracerProvider *sdktrace.TracerProvider
	// MeterProvider exports metrics every MetricInterval; nil with NoMetrics.
	MeterProvider *sdkmetric.MeterProvider
}

// StartOTLP sets up OTLP export of traces and metrics to one collector (an
// OpenTelemetry Collector, Jaeger for traces, Prometheus' OTLP receiver for
// metrics), as OTLPConfig says; NoTraces or NoMetrics turns either off. ctx
// governs creating the exporters only: nothing connects before the first
// export. Call Shutdown before the program exits: it flushes what is still
// buffered.
//
//	o, err := otelsetup.StartOTLP(ctx, otelsetup.OTLPConfig{ServiceName: "orders"})
//	if err != nil { ... }
//	defer o.Shutdown(context.Background())
//	tr := tracing.New(o.Options()...)
func StartOTLP(ctx context.Context, cfg OTLPConfig) (*OTLP, error) {
	if cfg.NoTraces && cfg.NoMetrics {
		return nil, errors.New("otelsetup: OTLP: NoTraces and NoMetrics leave nothing to export")
	}
	if cfg.MetricInterval < 0 {
		return nil, fmt.Errorf("otelsetup: OTLP metric interval %v: want > 0, or 0 for the default", cfg.MetricInterval)
	}
	attrs := make([]attribute.KeyValue, 0, len(cfg.Attributes)+1)
	if cfg.ServiceName != "" {
		attrs = append(attrs, semconv.ServiceName(cfg.ServiceName))
	}
	attrs = append(attrs, cfg.Attributes...)
	// resource.Default reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES;
	// the configuration's attributes take precedence.
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return nil, fmt.Errorf("otelsetup: OTLP resource: %w", err)
	}
	o := &OTLP{}
	if !cfg.NoTraces {
		exp, err := newSpanExporter(ctx, cfg)
		if err != nil {
			return nil, err
		}
		sampler := cfg.Sampler
		if sampler == nil {
			sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
		}
		o.TracerProvider = sdktrace.NewTracerProvider(
			sdktrace.WithBatcher(exp),
			sdktrace.WithResource(res),
			sdktrace.WithSampler(sampler),
		)
	}
	if !cfg.NoMetrics {
		exp, err := newMetricExporter(ctx, cfg)
		if err != nil {
			if o.TracerProvider != nil {
				_ = o.TracerProvider.Shutdown(ctx)
			}
			return nil, err
		}
		var readerOpts []sdkmetric.PeriodicReaderOption
		if cfg.MetricInterval > 0 {
			readerOpts = append(readerOpts, sdkmetric.WithInterval(cfg.MetricInterval))
		}
		o.MeterProvider = sdkmetric.NewMeterProvider(
			sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, readerOpts...)),
			sdkmetric.WithResource(res),
		)
	}
	if !cfg.NoGlobal {
		if o.TracerProvider != nil {
			otel.SetTracerProvider(o.TracerProvider)
		}
		if o.MeterProvider != nil {
			otel.SetMeterProvider(o.MeterProvider)
		}
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
			propagation.TraceContext{}, propagation.Baggage{}))
	}
	return o, nil
}

// Options returns [tracing.WithTracerProvider] and
// [tracing.WithMeterProvider] for the providers that were set up, for
// [tracing.New]. A signal turned off (NoTraces, NoMetrics) gets no option:
// the Tracer leaves it to a no-op provider unless given another.
func (o *OTLP) Options() []tracing.Option {
	var opts []tracing.Option
	if o.TracerProvider != nil {
		opts = append(opts, tracing.WithTracerProvider(o.TracerProvider))
	}
	if o.MeterProvider != nil {
		opts = append(opts, tracing.WithMeterProvider(o.MeterProvider))
	}
	return opts
}

// Shutdown flushes what is buffered, spans and a last collection of
// metrics, and stops both providers; ctx bounds the flush. The errors of
// both are returned joined.
func (o *OTLP) Shutdown(ctx context.Context) error {
	var errs []error
	if o.TracerProvider != nil {
		errs = append(errs, o.TracerProvider.Shutdown(ctx))
	}
	if o.MeterProvider != nil {
		errs = append(errs, o.MeterProvider.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
