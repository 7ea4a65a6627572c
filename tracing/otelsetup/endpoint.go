package otelsetup

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
)

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
	return "", fmt.Errorf("otelsetup: OTLP protocol %q: want %q or %q", protocol, ProtocolGRPC, ProtocolHTTP)
}

// otlpTarget is where and how one signal is exported.
type otlpTarget struct {
	protocol string // ProtocolGRPC or ProtocolHTTP
	endpoint string // "" leaves it to the exporter's environment variables
	isURL    bool
	insecure bool
	headers  map[string]string
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
	tg := otlpTarget{protocol: protocol, endpoint: endpoint, isURL: strings.Contains(endpoint, "://"), insecure: cfg.Insecure, headers: cfg.Headers}
	if tg.isURL && protocol == ProtocolHTTP {
		// The HTTP exporters send to a URL's path as it is, "/" when it has
		// none, where no collector listens: give it the signal's path.
		u, err := url.Parse(endpoint)
		if err != nil {
			return otlpTarget{}, fmt.Errorf("otelsetup: OTLP endpoint %q: %w", endpoint, err)
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

// clearTextByDefault reports whether endpoint is sent to without TLS when
// OTLPConfig.Insecure is not set: an http:// URL, or host:port on loopback.
func clearTextByDefault(endpoint string, isURL bool) (bool, error) {
	if isURL {
		u, err := url.Parse(endpoint)
		if err != nil {
			return false, fmt.Errorf("otelsetup: OTLP endpoint %q: %w", endpoint, err)
		}
		return u.Scheme == "http", nil // a URL's scheme says what it wants
	}
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return false, fmt.Errorf("otelsetup: OTLP endpoint %q: want host:port or a URL: %w", endpoint, err)
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
		return "", fmt.Errorf("otelsetup: OTLP endpoint %q: %w", cfg.Endpoint, err)
	}
	switch p := strings.TrimSuffix(u.Path, "/"); {
	case p == "":
		u.Path = "/v1/metrics"
	case strings.HasSuffix(p, "/v1/traces"):
		u.Path = strings.TrimSuffix(p, "/v1/traces") + "/v1/metrics"
	default:
		return "", fmt.Errorf("otelsetup: OTLP endpoint %q has a path of its own: set MetricsEndpoint too, or NoMetrics", cfg.Endpoint)
	}
	return u.String(), nil
}
