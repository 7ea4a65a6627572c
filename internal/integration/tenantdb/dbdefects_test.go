package tenantdb_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/internal/pgtest"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// The tests of issue 51's holes in Config.Database run on sharedPG, in
// databases of their own, as login roles of their own (so that the server's
// count of a role's backends is the Pool's).

// defectDatabases creates the databases names on sharedPG unless they exist,
// and returns a superuser connection to it.
func defectDatabases(t *testing.T, names ...string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(ctx) })
	rows, _ := admin.Query(ctx, "select datname from pg_database")
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if slices.Contains(have, name) {
			continue
		}
		if _, err := admin.Exec(ctx, "create database "+name); err != nil {
			t.Fatal(err)
		}
	}
	return admin
}

// loginAs returns a pgxpool.Config of budget connections to sharedPG as
// role, an ordinary login role created unless it exists.
func loginAs(t *testing.T, role string, budget int32) *pgxpool.Config {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(pgtest.AppRole(t, sharedPG.DSN, role, ""))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = budget
	return pcfg
}

// TestDatabaseBudgetWaitIsNotCached: a connect that timed out (connect_timeout)
// waiting for room in the budget is no failure of the database: the next
// call to that database, once room can be made from idle connections, is
// served, not failed with the first call's error (issue 51, item 7).
func TestDatabaseBudgetWaitIsNotCached(t *testing.T) {
	const db = "tenantdb_defects_wait"
	defectDatabases(t, db)
	pcfg := loginAs(t, "tenantdb_defects_wait_app", 2)
	pcfg.ConnConfig.ConnectTimeout = 500 * time.Millisecond
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:    map[string]tenantdb.Plan{"p": {MaxConns: 2}},
		Database: func(string) (string, error) { return db, nil },
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// The template database's connections, taken outside the gate, spend
	// the budget.
	ctx := context.Background()
	var held []*pgxpool.Conn
	for range 2 {
		c, err := p.Pgxpool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	_, err = p.Exec(as("x"), "select 1")
	if err == nil {
		t.Fatal("x connected with the budget spent")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("x's wait for room: %v, want an error matching context.DeadlineExceeded (connect_timeout)", err)
	}
	for _, c := range held {
		c.Release() // idle now: room can be made from them
	}
	var got string
	if err := p.QueryRow(as("y"), "select current_database()").Scan(&got); err != nil || got != db {
		t.Fatalf("y's call after x's wait for room timed out, with idle connections to close: %q, %v; want it served in %s",
			got, err, db)
	}
	if st := p.DatabasesStat(); st.Open > 2 {
		t.Fatalf("%+v: over the budget", st)
	}
	assertNothingHeld(t, p)
}
