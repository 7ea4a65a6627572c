package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
)

// PrometheusConfig configures NewPrometheusExporter. The zero value is the
// default: a registry of the exporter's own, the SDK's default resource.
type PrometheusConfig struct {
	// Registry is where the metrics are registered and what Handler serves.
	// Default: a new registry, so that two exporters (two pools in one test
	// binary) never collide and the process's other collectors are not
	// mixed in. Give the application's registry to serve tenantdb's metrics
	// beside its own from one endpoint; give one registry to one exporter
	// only, since two would serve the same series twice.
	Registry *prometheus.Registry

	// Resource describes the service; Prometheus gets it as the target_info
	// series. Default: resource.Default(), which reads OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES.
	Resource *resource.Resource
}

// PrometheusExporter is a MeterProvider whose metrics Prometheus scrapes
// from Handler, the pull alternative to StartOTLP's push. Metric names follow
// the OpenTelemetry-to-Prometheus rules: dots become underscores, the unit
// is appended ("_seconds"), counters end in "_total", so
// tenantdb.tenant.connection.rejections is
// tenantdb_tenant_connection_rejections_total and
// db.client.operation.duration is db_client_operation_duration_seconds.
type PrometheusExporter struct {
	provider *metric.MeterProvider
	handler  http.Handler
}

// NewPrometheusExporter returns an exporter whose MeterProvider is given to
// [tracing.New] with [tracing.WithMeterProvider] and whose Handler is
// mounted where Prometheus scrapes, usually /metrics:
//
//	pe, err := otelsetup.NewPrometheusExporter(otelsetup.PrometheusConfig{})
//	if err != nil { ... }
//	defer pe.Shutdown(context.Background())
//	tr := tracing.New(tracing.WithMeterProvider(pe.MeterProvider()))
//	http.Handle("/metrics", pe.Handler())
//
// It fails only when the registry refuses the exporter's collector.
func NewPrometheusExporter(cfg PrometheusConfig) (*PrometheusExporter, error) {
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("otelsetup: Prometheus exporter: %w", err)
	}
	res := cfg.Resource
	if res == nil {
		res = resource.Default()
	}
	return &PrometheusExporter{
		provider: metric.NewMeterProvider(metric.WithReader(exp), metric.WithResource(res)),
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}, nil
}

// MeterProvider is the provider to give [tracing.New]
// ([tracing.WithMeterProvider]), and any other instrumentation whose metrics
// should be scraped with tenantdb's.
func (e *PrometheusExporter) MeterProvider() *metric.MeterProvider { return e.provider }

// Handler serves the metrics in Prometheus' text or protobuf formats, each
// request collecting them afresh (the pool's gauges are read then).
func (e *PrometheusExporter) Handler() http.Handler { return e.handler }

// Shutdown stops the MeterProvider; the handler then serves no tenantdb
// metrics. ctx bounds the shutdown.
func (e *PrometheusExporter) Shutdown(ctx context.Context) error {
	if err := e.provider.Shutdown(ctx); err != nil && !errors.Is(err, metric.ErrReaderShutdown) {
		return fmt.Errorf("otelsetup: Prometheus exporter shutdown: %w", err)
	}
	return nil
}
