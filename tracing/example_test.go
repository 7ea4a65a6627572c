package tracing_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tracing"
)

// A service whose OpenTelemetry providers are set up at start-up (by
// package tracing/otelsetup, or the service's own SDK setup) and installed
// as otel's global ones, which it passes to New: per-tenant spans and
// metrics, with leak detection.
func Example() {
	ctx := context.Background()
	tr := tracing.New(
		tracing.WithTracerProvider(otel.GetTracerProvider()),
		tracing.WithMeterProvider(otel.GetMeterProvider()),
		tracing.WithPoolName("orders"),
		tracing.WithCardinality(tracing.TopTenants(10, 100)),
		tracing.WithLeakDetection(30*time.Second),
	)
	pgxCfg, err := pgxpool.ParseConfig("postgres://app@localhost/orders")
	if err != nil {
		log.Fatal(err)
	}
	p, err := tenantdb.New(ctx, pgxCfg, tenantdb.Config{Tracer: tr})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	stop, err := tr.ObservePool(p)
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	// In a handler, under the request's span (otelhttp's, say):
	ctx = tenantdb.WithTenant(ctx, "acme")
	if _, err := p.Exec(ctx, "select 1"); err != nil {
		log.Print(err)
	}
}
