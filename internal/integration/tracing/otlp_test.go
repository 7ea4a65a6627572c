package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
	"github.com/tenantdb/tenantdb/tracing/otelsetup"
)

// TestStartOTLPReachesJaegerAndPrometheus sends both signals of StartOTLP,
// over gRPC and HTTP, to a real OpenTelemetry Collector (the one inside
// Jaeger v2: spans to Jaeger's storage, metrics to the Collector's
// prometheus exporter) and reads them back: the spans from Jaeger's query
// API, the per-tenant metrics and db.client.operation.duration from a real
// Prometheus scraping the Collector, under the same names that
// NewPrometheusExporter gives them, so the shipped rules serve both paths.
func TestStartOTLPReachesJaegerAndPrometheus(t *testing.T) {
	j := tenantdbtest.StartJaeger(t, tenantdbtest.WithJaegerPrometheusExporter())
	prom := tenantdbtest.StartPrometheus(t, j.MetricsEndpoint)
	for _, protocol := range []string{otelsetup.ProtocolGRPC, otelsetup.ProtocolHTTP} {
		t.Run(protocol, func(t *testing.T) {
			endpoint := j.OTLPGRPCEndpoint
			if protocol == otelsetup.ProtocolHTTP {
				endpoint = "http://" + j.OTLPHTTPEndpoint // a URL without a path: /v1/traces and /v1/metrics
			}
			service := fmt.Sprintf("tenantdb-otlp-%s-%d", protocol[:4], time.Now().UnixNano())
			o, err := otelsetup.StartOTLP(context.Background(), otelsetup.OTLPConfig{
				Endpoint: endpoint, Protocol: protocol, ServiceName: service, MetricInterval: 200 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = o.Shutdown(context.Background()) })
			pool := "otlp-" + protocol[:4]
			tr := tracing.New(append(o.Options(), tracing.WithPoolName(pool), tracing.WithCardinality(tracing.ByTenant(10)))...)
			p := newTracedPool(t, tr, nil, 2, tenantdb.Config{
				Plans: map[string]tenantdb.Plan{"free": {MaxConns: 1}},
			})

			// One traced query while another holds the tenant's only
			// connection: a span for Jaeger, a rejection and durations
			// for Prometheus.
			ctx, root := o.TracerProvider.Tracer("test").Start(tenantdb.WithTenant(context.Background(), "noisy"), "request")
			conn, err := p.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Exec(ctx, "select 1"); !errors.Is(err, tenantdb.ErrOverLimit) {
				t.Fatalf("second connection of a tenant capped at one: %v", err)
			}
			if _, err := conn.Exec(ctx, "select 1"); err != nil {
				t.Fatal(err)
			}
			conn.Release()
			root.End()

			pollJaeger(t, j.QueryURL, service, func(spans []jaegerSpan) error {
				if len(byTenant(spans, tracing.AcquireSpanName, "noisy")) != 2 {
					return fmt.Errorf("%d spans, want both admission spans of noisy", len(spans))
				}
				return nil
			})
			tenantdbtest.EventuallyNoError(t, 60*time.Second, "the OTLP metrics in Prometheus", func(ctx context.Context) error {
				for _, expr := range []string{
					fmt.Sprintf(`tenantdb_tenant_connection_rejections_total{db_client_connection_pool_name=%q,tenantdb_tenant_id="noisy",tenantdb_outcome="rejected"}`, pool),
					fmt.Sprintf(`tenantdb_tenant_connection_use_time_seconds_count{db_client_connection_pool_name=%q,tenantdb_tenant_id="noisy"}`, pool),
					fmt.Sprintf(`db_client_operation_duration_seconds_count{exported_job=%q,db_operation_name="SELECT",db_system_name="postgresql"}`, service),
				} {
					s, err := prom.Query(ctx, expr)
					if err != nil {
						return err
					}
					if len(s) != 1 || s[0].Value != 1 {
						return fmt.Errorf("%s: %v, want one series of 1", expr, s)
					}
				}
				return nil
			})
		})
	}
}
