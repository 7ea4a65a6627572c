package tracing_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tracing"
)

// A service sending its traces to a local Jaeger (OTLP on localhost:4317),
// with per-tenant metrics on the global MeterProvider and leak detection.
func Example() {
	ctx := context.Background()
	tp, shutdown, err := tracing.SetupOTLP(ctx, tracing.OTLPConfig{ServiceName: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	defer shutdown(context.Background()) // flushes the last spans

	tr := tracing.New(
		tracing.WithTracerProvider(tp),
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
