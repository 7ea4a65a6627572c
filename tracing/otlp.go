package tracing

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// OTLP protocols for OTLPConfig.Protocol.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// OTLPConfig configures StartOTLP and SetupOTLP. Zero values mean the
// documented defaults; the usual OTEL_EXPORTER_OTLP_* environment variables
// apply where a field is left empty.
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

	// SetGlobal also installs the providers as otel's global TracerProvider
	// and MeterProvider, and the W3C trace-context and baggage propagators
	// as the global propagator, so that other instrumentation (otelhttp)
	// joins the same traces. Default false: the caller passes the providers
	// where needed (OTLP.Options, WithTracerProvider, WithMeterProvider).
	SetGlobal bool

	// NoTraces turns span export off (StartOTLP only), for a service that
	// exports only metrics this way.
	NoTraces bool

	// NoMetrics turns metric export off, for a service that exports metrics
	// otherwise (NewPrometheusExporter) or sends them to Jaeger, which
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

// SetupOTLP returns a TracerProvider that batches spans to an OTLP collector,
// such as Jaeger, over gRPC or HTTP, and the function that flushes and
// stops it, to be called before the program exits (spans still in the batch
// are lost otherwise). ctx governs creating the exporter only; neither
// protocol connects before the first export, so an unreachable collector is
// reported by otel.Handle at export time, not here.
//
// It exports traces only, as it always has (Jaeger takes no metrics): for
// metrics too, use StartOTLP, whose MeterProvider goes to WithMeterProvider.
//
//	tp, shutdown, err := tracing.SetupOTLP(ctx, tracing.OTLPConfig{ServiceName: "orders"})
//	if err != nil { ... }
//	defer shutdown(context.Background())
//	tr := tracing.New(tracing.WithTracerProvider(tp))
func SetupOTLP(ctx context.Context, cfg OTLPConfig) (tp *sdktrace.TracerProvider, shutdown func(context.Context) error, err error) {
	cfg.NoTraces, cfg.NoMetrics = false, true
	o, err := StartOTLP(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return o.TracerProvider, o.Shutdown, nil
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
//	o, err := tracing.StartOTLP(ctx, tracing.OTLPConfig{ServiceName: "orders"})
//	if err != nil { ... }
//	defer o.Shutdown(context.Background())
//	tr := tracing.New(o.Options()...)
func StartOTLP(ctx context.Context, cfg OTLPConfig) (*OTLP, error) {
	if cfg.NoTraces && cfg.NoMetrics {
		return nil, errors.New("tracing: OTLP: NoTraces and NoMetrics leave nothing to export")
	}
	if cfg.MetricInterval < 0 {
		return nil, fmt.Errorf("tracing: OTLP metric interval %v: want > 0, or 0 for the default", cfg.MetricInterval)
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
		return nil, fmt.Errorf("tracing: OTLP resource: %w", err)
	}
	o := &OTLP{}
	if !cfg.NoTraces {
		exp, err := newOTLPExporter(ctx, cfg)
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
		exp, err := newOTLPMetricExporter(ctx, cfg)
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
	if cfg.SetGlobal {
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

// Options returns WithTracerProvider and WithMeterProvider for the
// providers that were set up, for New.
func (o *OTLP) Options() []Option {
	var opts []Option
	if o.TracerProvider != nil {
		opts = append(opts, WithTracerProvider(o.TracerProvider))
	}
	if o.MeterProvider != nil {
		opts = append(opts, WithMeterProvider(o.MeterProvider))
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

// otlpProtocol is the protocol of one signal: OTLPConfig.Protocol, else the
// environment's, else gRPC.
func otlpProtocol(cfg OTLPConfig, signal string) (string, error) {
	protocol := cfg.Protocol
	if protocol == "" {
		protocol = firstEnv("OTEL_EXPORTER_OTLP_"+signal+"_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch protocol {
	case "", ProtocolGRPC:
		return ProtocolGRPC, nil
	case ProtocolHTTP, "http":
		return ProtocolHTTP, nil
	}
	return "", fmt.Errorf("tracing: OTLP protocol %q: want %q or %q", protocol, ProtocolGRPC, ProtocolHTTP)
}

// otlpTarget is where and how one signal is exported.
type otlpTarget struct {
	protocol string // ProtocolGRPC or ProtocolHTTP
	endpoint string // "" leaves it to the exporter's environment variables
	isURL    bool
	insecure bool
}

// resolveOTLPTarget applies OTLPConfig's defaults for one signal, "TRACES" or
// "METRICS" as in the OTEL_EXPORTER_OTLP_{signal}_* variables; endpoint is
// what the configuration says for that signal.
func resolveOTLPTarget(cfg OTLPConfig, signal, endpoint string) (otlpTarget, error) {
	protocol, err := otlpProtocol(cfg, signal)
	if err != nil {
		return otlpTarget{}, err
	}
	if endpoint == "" && firstEnv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
		// The exporters' own default is localhost too, but with TLS for
		// gRPC; saying it here lets the loopback rule below apply.
		endpoint = "localhost:4317"
		if protocol == ProtocolHTTP {
			endpoint = "localhost:4318"
		}
	}
	tg := otlpTarget{protocol: protocol, endpoint: endpoint, isURL: strings.Contains(endpoint, "://"), insecure: cfg.Insecure}
	if tg.isURL && protocol == ProtocolHTTP {
		// The HTTP exporters send to a URL's path as it is, "/" when it has
		// none, where no collector listens: give it the signal's path.
		u, err := url.Parse(endpoint)
		if err != nil {
			return otlpTarget{}, fmt.Errorf("tracing: OTLP endpoint %q: %w", endpoint, err)
		}
		if strings.TrimSuffix(u.Path, "/") == "" {
			u.Path = "/v1/" + strings.ToLower(signal)
			tg.endpoint = u.String()
		}
	}
	if endpoint != "" && !tg.insecure {
		var err error
		if tg.insecure, err = clearTextByDefault(endpoint, tg.isURL); err != nil {
			return otlpTarget{}, err
		}
	}
	return tg, nil
}

func newOTLPExporter(ctx context.Context, cfg OTLPConfig) (sdktrace.SpanExporter, error) {
	tg, err := resolveOTLPTarget(cfg, "TRACES", cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	protocol, endpoint, isURL, insecure := tg.protocol, tg.endpoint, tg.isURL, tg.insecure
	var exp sdktrace.SpanExporter
	if protocol == ProtocolGRPC {
		var opts []otlptracegrpc.Option
		switch {
		case isURL:
			opts = append(opts, otlptracegrpc.WithEndpointURL(endpoint))
		case endpoint != "":
			opts = append(opts, otlptracegrpc.WithEndpoint(endpoint))
		}
		if insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		if len(cfg.Headers) > 0 {
			opts = append(opts, otlptracegrpc.WithHeaders(cfg.Headers))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	} else {
		var opts []otlptracehttp.Option
		switch {
		case isURL:
			opts = append(opts, otlptracehttp.WithEndpointURL(endpoint))
		case endpoint != "":
			opts = append(opts, otlptracehttp.WithEndpoint(endpoint))
		}
		if insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		if len(cfg.Headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(cfg.Headers))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP %s exporter for %q: %w", protocol, endpoint, err)
	}
	return exp, nil
}

// clearTextByDefault reports whether endpoint is sent to without TLS when
// OTLPConfig.Insecure is not set: an http:// URL, or host:port on loopback.
func clearTextByDefault(endpoint string, isURL bool) (bool, error) {
	if isURL {
		u, err := url.Parse(endpoint)
		if err != nil {
			return false, fmt.Errorf("tracing: OTLP endpoint %q: %w", endpoint, err)
		}
		return u.Scheme == "http", nil // a URL's scheme says what it wants
	}
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return false, fmt.Errorf("tracing: OTLP endpoint %q: want host:port or a URL: %w", endpoint, err)
	}
	return isLoopback(host), nil
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}
