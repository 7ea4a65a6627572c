package tracing

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// OTLP protocols for OTLPConfig.Protocol.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// OTLPConfig configures SetupOTLP. Zero values mean the documented defaults;
// the usual OTEL_EXPORTER_OTLP_* environment variables apply where a field
// is left empty.
type OTLPConfig struct {
	// Endpoint is where spans go: host:port (localhost:4317), or a URL
	// (http://jaeger:4318, https://collector.example.com:4317; for HTTP a
	// URL's path replaces /v1/traces). Default: the environment's
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT,
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

	// SetGlobal also installs the provider as otel's global TracerProvider
	// and the W3C trace-context and baggage propagators as the global
	// propagator, so that other instrumentation (otelhttp) joins the same
	// traces. Default false: the caller passes the provider where needed
	// (WithTracerProvider).
	SetGlobal bool
}

// SetupOTLP returns a TracerProvider that batches spans to an OTLP collector,
// such as Jaeger, over gRPC or HTTP, and the function that flushes and
// stops it, to be called before the program exits (spans still in the batch
// are lost otherwise). ctx governs creating the exporter only; neither
// protocol connects before the first export, so an unreachable collector is
// reported by otel.Handle at export time, not here.
//
//	tp, shutdown, err := tracing.SetupOTLP(ctx, tracing.OTLPConfig{ServiceName: "orders"})
//	if err != nil { ... }
//	defer shutdown(context.Background())
//	tr := tracing.New(tracing.WithTracerProvider(tp))
func SetupOTLP(ctx context.Context, cfg OTLPConfig) (tp *sdktrace.TracerProvider, shutdown func(context.Context) error, err error) {
	exp, err := newOTLPExporter(ctx, cfg)
	if err != nil {
		return nil, nil, err
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
		_ = exp.Shutdown(ctx)
		return nil, nil, fmt.Errorf("tracing: OTLP resource: %w", err)
	}
	sampler := cfg.Sampler
	if sampler == nil {
		sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
	}
	tp = sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sampler),
	)
	if cfg.SetGlobal {
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
			propagation.TraceContext{}, propagation.Baggage{}))
	}
	return tp, tp.Shutdown, nil
}

func newOTLPExporter(ctx context.Context, cfg OTLPConfig) (sdktrace.SpanExporter, error) {
	protocol := cfg.Protocol
	if protocol == "" {
		protocol = firstEnv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch protocol {
	case "", ProtocolGRPC:
		protocol = ProtocolGRPC
	case ProtocolHTTP, "http":
		protocol = ProtocolHTTP
	default:
		return nil, fmt.Errorf("tracing: OTLP protocol %q: want %q or %q", protocol, ProtocolGRPC, ProtocolHTTP)
	}
	endpoint := cfg.Endpoint
	if endpoint == "" && firstEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
		// The exporters' own default is localhost too, but with TLS for
		// gRPC; saying it here lets the loopback rule below apply.
		endpoint = "localhost:4317"
		if protocol == ProtocolHTTP {
			endpoint = "localhost:4318"
		}
	}
	isURL := strings.Contains(endpoint, "://")
	insecure := cfg.Insecure
	if endpoint != "" && !insecure {
		var err error
		if insecure, err = clearTextByDefault(endpoint, isURL); err != nil {
			return nil, err
		}
	}

	var (
		exp sdktrace.SpanExporter
		err error
	)
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
