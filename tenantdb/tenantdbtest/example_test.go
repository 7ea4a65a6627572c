package tenantdbtest_test

import (
	"context"
	"log"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// A program outside tests, like the noisy-neighbour demo, starts PostgreSQL
// with RunPostgres and terminates it itself.
func ExampleRunPostgres() {
	ctx := context.Background()
	pg, err := tenantdbtest.RunPostgres(ctx, tenantdbtest.WithMaxConnections(400))
	if err != nil {
		log.Fatal(err)
	}
	defer pg.Terminate(context.Background())

	cfg, err := pgxpool.ParseConfig(pg.DSN)
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
}

// In a test, StartPostgres fails the test when no server can be had and
// removes the container when the test ends. Restart breaks every connection
// and brings the server back at the same DSN.
func ExampleStartPostgres() {
	var t testing.TB // the test's *testing.T
	pg := tenantdbtest.StartPostgres(t, tenantdbtest.WithInitScripts("testdata/schema.sql"))

	pool, err := pgxpool.New(t.Context(), pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A test waits for a restarted server to answer with EventuallyNoError,
// and for in-process state (here, the pool's connections returned) with
// Eventually; both fail the test, saying what they waited for, if the
// timeout passes first.
func ExampleEventually() {
	var t testing.TB // the test's *testing.T
	pg := tenantdbtest.StartPostgres(t)
	pool, err := pgxpool.New(t.Context(), pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "the server answers after its restart", pool.Ping)
	tenantdbtest.Eventually(t, time.Minute, "every connection is back in the pool", func() bool {
		return pool.Stat().AcquiredConns() == 0
	})
}
