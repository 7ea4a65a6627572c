package otelsetup_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tracing"
	"github.com/tenantdb/tenantdb/tracing/otelsetup"
)

// TestPrometheusExporterRegistries: exporters get registries of their own by
// default, so two coexist and each serves its own Tracer's metrics; a given
// registry is where the metrics go.
func TestPrometheusExporterRegistries(t *testing.T) {
	a, err := otelsetup.NewPrometheusExporter(otelsetup.PrometheusConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(context.Background())
	b, err := otelsetup.NewPrometheusExporter(otelsetup.PrometheusConfig{})
	if err != nil {
		t.Fatalf("a second exporter: %v", err)
	}
	defer b.Shutdown(context.Background())

	reg := prometheus.NewRegistry()
	c, err := otelsetup.NewPrometheusExporter(otelsetup.PrometheusConfig{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	tc := tracing.New(tracing.WithMeterProvider(c.MeterProvider()), tracing.WithPoolName("given-registry"))
	acquireOnce(t, tc)
	if mfs, err := reg.Gather(); err != nil || len(mfs) == 0 {
		t.Errorf("the given registry gathers %d families, %v", len(mfs), err)
	}

	// What one Tracer records is served by its exporter's handler only.
	tr := tracing.New(tracing.WithMeterProvider(a.MeterProvider()), tracing.WithPoolName("only-a"))
	acquireOnce(t, tr)
	body := func(e *otelsetup.PrometheusExporter) string {
		rec := httptest.NewRecorder()
		e.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		return rec.Body.String()
	}
	if !strings.Contains(body(a), `db_client_connection_use_time_seconds_count{db_client_connection_pool_name="only-a"`) {
		t.Errorf("exporter a does not serve its Tracer's use time:\n%s", body(a))
	}
	if strings.Contains(body(b), "only-a") {
		t.Errorf("exporter b serves a's metrics")
	}
}

// acquireOnce takes and returns one permit of a gate traced by tr, so that
// tr records the connection-pool metrics of one use.
func acquireOnce(t *testing.T, tr *tracing.Tracer) {
	t.Helper()
	g, err := pool.New(pool.Config{Capacity: 1, Plans: map[string]pool.Plan{"p": {MaxConns: 1}}, Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	p, err := g.Acquire(context.Background(), "t")
	if err != nil {
		t.Fatal(err)
	}
	p.Release()
}
