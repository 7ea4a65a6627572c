package tenantdbtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

const (
	jaegerQueryURLEnv     = "TENANTDB_JAEGER_QUERY_URL"
	jaegerOTLPGRPCEnv     = "TENANTDB_JAEGER_OTLP_GRPC_ENDPOINT"
	jaegerOTLPHTTPEnv     = "TENANTDB_JAEGER_OTLP_HTTP_ENDPOINT"
	jaegerOTLPGRPCPort    = "4317/tcp"
	jaegerOTLPHTTPPort    = "4318/tcp"
	jaegerQueryPort       = "16686/tcp"
	jaegerMetricsPort     = "8889/tcp"
	jaegerMetricsConfig   = "/etc/jaeger/tenantdbtest-metrics.yaml"
	jaegerReadyLogMessage = "Everything is ready. Begin running and processing data."
)

// Jaeger is a Jaeger (v2) server with in-memory storage for tests: a
// container started by StartJaeger or RunJaeger, or an existing server named
// by TENANTDB_JAEGER_QUERY_URL.
type Jaeger struct {
	// OTLPGRPCEndpoint is host:port of the OTLP/gRPC receiver, for
	// otlptracegrpc.WithEndpoint together with WithInsecure.
	OTLPGRPCEndpoint string
	// OTLPHTTPEndpoint is host:port of the OTLP/HTTP receiver, for
	// otlptracehttp.WithEndpoint together with WithInsecure.
	OTLPHTTPEndpoint string
	// QueryURL is the query service, http://host:port: its HTTP API
	// (QueryURL + "/api/traces?service=...") and, with the official image,
	// the UI. The locally built image serves the API but only a placeholder
	// page for the UI, whose assets are not part of the Go module.
	QueryURL string
	// MetricsEndpoint is host:port where, with WithJaegerPrometheusExporter,
	// the metrics received over OTLP are served for Prometheus at /metrics;
	// empty otherwise.
	MetricsEndpoint string
	// Image is the image the container runs; empty for an existing server.
	Image string
	// Container is the running container; nil for an existing server.
	Container *testcontainers.DockerContainer

	base
}

type jaegerConfig struct {
	image          string
	startupTimeout time.Duration
	metrics        bool
}

// WithJaegerPrometheusExporter makes the collector inside Jaeger (Jaeger v2
// is an OpenTelemetry Collector distribution) take OTLP metrics too and
// serve them for Prometheus at Jaeger.MetricsEndpoint, through the
// Collector's prometheus exporter: a real OTLP metrics receiver where no
// other is at hand. Jaeger itself stores no metrics. It replaces the image's
// configuration with one of the same traces pipeline plus a metrics one.
func WithJaegerPrometheusExporter() JaegerOption {
	return func(c *jaegerConfig) { c.metrics = true }
}

// jaegerMetricsYAML is the configuration of WithJaegerPrometheusExporter:
// testdata/images/jaeger/config.yaml's, plus metrics from OTLP to the
// prometheus exporter. Metric names keep their unit and type suffixes, as
// otelsetup.NewPrometheusExporter's do, so that the same PromQL serves both.
const jaegerMetricsYAML = `service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
    metrics:
      receivers: [otlp]
      exporters: [prometheus]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    enable_tracing: false
    http:
      endpoint: 0.0.0.0:16686
    grpc:
      endpoint: 0.0.0.0:16685
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 0.0.0.0:13133
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 0.0.0.0:4317
      http:
        endpoint: 0.0.0.0:4318
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
  prometheus:
    endpoint: 0.0.0.0:8889
    add_metric_suffixes: true
`

// JaegerOption configures StartJaeger and RunJaeger.
type JaegerOption func(*jaegerConfig)

// WithJaegerImage runs image instead of the one chosen from
// TENANTDB_JAEGER_IMAGE or the defaults: a Jaeger v2 image whose
// configuration binds OTLP (4317, 4318) and the query service (16686) to
// all addresses, as the official one does.
func WithJaegerImage(image string) JaegerOption {
	return func(c *jaegerConfig) { c.image = image }
}

// WithJaegerStartupTimeout bounds how long starting waits for Jaeger to be
// ready; the default is one minute.
func WithJaegerStartupTimeout(d time.Duration) JaegerOption {
	return func(c *jaegerConfig) { c.startupTimeout = d }
}

// jaegerService is how StartJaeger and RunJaeger get a Jaeger server.
var jaegerService = service[*Jaeger, JaegerOption]{
	envVar:   jaegerQueryURLEnv,
	existing: existingJaeger,
	run:      runJaeger,
	describe: func(j *Jaeger) string {
		return fmt.Sprintf("Jaeger (%s): OTLP gRPC %s, OTLP HTTP %s, query %s", j.Image, j.OTLPGRPCEndpoint, j.OTLPHTTPEndpoint, j.QueryURL)
	},
}

// StartJaeger returns a Jaeger server for t, started in a container that is
// terminated when t ends, or the server TENANTDB_JAEGER_QUERY_URL names. It
// fails t when neither can be had, never skips it.
func StartJaeger(t testing.TB, opts ...JaegerOption) *Jaeger {
	t.Helper()
	return jaegerService.start(t, opts)
}

// RunJaeger is StartJaeger for programs outside tests: ctx governs starting
// the container only. The caller must call Terminate when done; on error no
// container is left running.
func RunJaeger(ctx context.Context, opts ...JaegerOption) (*Jaeger, error) {
	return jaegerService.runForProgram(ctx, opts)
}

// existingJaeger describes the server of TENANTDB_JAEGER_QUERY_URL; its
// OTLP endpoints default to the standard ports on the same host.
func existingJaeger(q string) (*Jaeger, error) {
	u, err := url.Parse(q)
	if err != nil || u.Hostname() == "" {
		return nil, fmt.Errorf("tenantdbtest: %s=%q is not an http://host:port URL", jaegerQueryURLEnv, q)
	}
	j := &Jaeger{
		QueryURL:         q,
		OTLPGRPCEndpoint: os.Getenv(jaegerOTLPGRPCEnv),
		OTLPHTTPEndpoint: os.Getenv(jaegerOTLPHTTPEnv),
	}
	if j.OTLPGRPCEndpoint == "" {
		j.OTLPGRPCEndpoint = net.JoinHostPort(u.Hostname(), "4317")
	}
	if j.OTLPHTTPEndpoint == "" {
		j.OTLPHTTPEndpoint = net.JoinHostPort(u.Hostname(), "4318")
	}
	return j, nil
}

func runJaeger(ctx context.Context, opts []JaegerOption) (*Jaeger, error) {
	cfg := withOptions(jaegerConfig{startupTimeout: time.Minute}, opts)
	d, image, err := jaegerImages.connect(ctx, "Jaeger", jaegerQueryURLEnv, cfg.image)
	if err != nil {
		return nil, err
	}

	// Jaeger is not stopped and started by tests (its storage is in
	// memory anyway), so ephemeral host ports will do, on loopback for a
	// local daemon as with the other services. The local image has
	// no shell, so the port wait's check inside the container cannot run:
	// readiness is the collector's own "everything is ready" line, logged
	// after every receiver has started, and an answer from the query API.
	runOpts := []testcontainers.ContainerCustomizer{
		testcontainers.WithExposedPorts(jaegerOTLPGRPCPort, jaegerOTLPHTTPPort, jaegerQueryPort),
		withHostPort(jaegerOTLPGRPCPort, d.bindIP, 0),
		withHostPort(jaegerOTLPHTTPPort, d.bindIP, 0),
		withHostPort(jaegerQueryPort, d.bindIP, 0),
		testcontainers.WithWaitStrategyAndDeadline(cfg.startupTimeout,
			wait.ForLog(jaegerReadyLogMessage).WithStartupTimeout(cfg.startupTimeout),
			wait.ForHTTP("/api/services").WithPort(jaegerQueryPort).WithStartupTimeout(cfg.startupTimeout),
		),
	}
	if cfg.metrics {
		runOpts = append(runOpts,
			testcontainers.WithExposedPorts(jaegerMetricsPort),
			withHostPort(jaegerMetricsPort, d.bindIP, 0),
			testcontainers.WithFiles(testcontainers.ContainerFile{
				Reader: strings.NewReader(jaegerMetricsYAML), ContainerFilePath: jaegerMetricsConfig, FileMode: 0o644,
			}),
			testcontainers.WithCmd("--config", jaegerMetricsConfig),
		)
	}
	ctr, err := testcontainers.Run(ctx, image, runOpts...)
	j := &Jaeger{Image: image, Container: ctr, base: newBase("Jaeger", ctr)}
	if err != nil {
		return j, jaegerImages.startError("Jaeger", image, err)
	}
	endpoint := func(port string) (string, error) {
		p, err := mappedHostPort(ctx, ctr, port)
		if err != nil {
			return "", fmt.Errorf("tenantdbtest: Jaeger port %s: %w", port, err)
		}
		return net.JoinHostPort(d.host, strconv.Itoa(p)), nil
	}
	if j.OTLPGRPCEndpoint, err = endpoint(jaegerOTLPGRPCPort); err != nil {
		return j, err
	}
	if j.OTLPHTTPEndpoint, err = endpoint(jaegerOTLPHTTPPort); err != nil {
		return j, err
	}
	query, err := endpoint(jaegerQueryPort)
	if err != nil {
		return j, err
	}
	j.QueryURL = "http://" + query
	if cfg.metrics {
		if j.MetricsEndpoint, err = endpoint(jaegerMetricsPort); err != nil {
			return j, err
		}
	}
	return j, nil
}

// Terminate stops and removes the container; ctx governs the Docker
// requests. It does nothing for an existing server, and only the first call
// does anything. StartJaeger arranges it through t.Cleanup; after RunJaeger
// the caller must call it.
func (j *Jaeger) Terminate(ctx context.Context) error { return terminate(ctx, j) }
