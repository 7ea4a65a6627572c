package tracing

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// newOTLPMetricExporter makes StartOTLP's metric exporter, with the same
// protocol, TLS rule and headers as its span exporter. Temporality is the
// SDK's default, cumulative, which is what Prometheus' OTLP receiver takes.
func newOTLPMetricExporter(ctx context.Context, cfg OTLPConfig) (sdkmetric.Exporter, error) {
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
		var opts []otlpmetricgrpc.Option
		switch {
		case tg.isURL:
			opts = append(opts, otlpmetricgrpc.WithEndpointURL(tg.endpoint))
		case tg.endpoint != "":
			opts = append(opts, otlpmetricgrpc.WithEndpoint(tg.endpoint))
		}
		if tg.insecure {
			opts = append(opts, otlpmetricgrpc.WithInsecure())
		}
		if len(cfg.Headers) > 0 {
			opts = append(opts, otlpmetricgrpc.WithHeaders(cfg.Headers))
		}
		exp, err = otlpmetricgrpc.New(ctx, opts...)
	} else {
		var opts []otlpmetrichttp.Option
		switch {
		case tg.isURL:
			opts = append(opts, otlpmetrichttp.WithEndpointURL(tg.endpoint))
		case tg.endpoint != "":
			opts = append(opts, otlpmetrichttp.WithEndpoint(tg.endpoint))
		}
		if tg.insecure {
			opts = append(opts, otlpmetrichttp.WithInsecure())
		}
		if len(cfg.Headers) > 0 {
			opts = append(opts, otlpmetrichttp.WithHeaders(cfg.Headers))
		}
		exp, err = otlpmetrichttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP %s metric exporter for %q: %w", tg.protocol, tg.endpoint, err)
	}
	return exp, nil
}

// metricsEndpoint is OTLPConfig.MetricsEndpoint, or what Endpoint means for
// metrics: the same host:port or gRPC URL; for an HTTP URL, the same server
// with the path /v1/traces (or none) made /v1/metrics, since an OTLP/HTTP
// exporter sends to a URL's path as it is. "" leaves it to the environment,
// whose OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, being about metrics, comes
// before Endpoint.
func metricsEndpoint(cfg OTLPConfig) (string, error) {
	if cfg.MetricsEndpoint != "" {
		return cfg.MetricsEndpoint, nil
	}
	if cfg.Endpoint == "" || firstEnv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != "" {
		return "", nil // the exporter reads the variables
	}
	protocol, err := otlpProtocol(cfg, "METRICS")
	if err != nil {
		return "", err
	}
	if protocol != ProtocolHTTP || !strings.Contains(cfg.Endpoint, "://") {
		return cfg.Endpoint, nil // gRPC has no paths
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil {
		return "", fmt.Errorf("tracing: OTLP endpoint %q: %w", cfg.Endpoint, err)
	}
	switch p := strings.TrimSuffix(u.Path, "/"); {
	case p == "":
		u.Path = "/v1/metrics"
	case strings.HasSuffix(p, "/v1/traces"):
		u.Path = strings.TrimSuffix(p, "/v1/traces") + "/v1/metrics"
	default:
		return "", fmt.Errorf("tracing: OTLP endpoint %q has a path of its own: set MetricsEndpoint too, or NoMetrics", cfg.Endpoint)
	}
	return u.String(), nil
}
