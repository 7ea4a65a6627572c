// Command instrumented is the smallest program that instruments tenantdb:
// tenantdb.New with tracing.New(). TestInstrumentedProgramModules counts the
// modules it links.
package main

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tracing"
)

func main() {
	ctx := context.Background()
	pgxCfg, err := pgxpool.ParseConfig("")
	if err != nil {
		log.Fatal(err)
	}
	p, err := tenantdb.New(ctx, pgxCfg, tenantdb.Config{Tracer: tracing.New()})
	if err != nil {
		log.Fatal(err)
	}
	p.Close()
}
