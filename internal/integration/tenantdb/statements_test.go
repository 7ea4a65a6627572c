package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestHandoverRecreatesPgxStatements: pgx's statements stay across a change
// of tenant, and a statement a tenant prepared from SQL makes the reset at
// release drop them all (pgx's caches too), so pgx prepares its own again.
// Over many turns between two tenants on one connection, with single
// queries, batches and a transaction, each call answers its own tenant, the
// server never holds a statement prepared by SQL after the turn, and pgx's
// cache keeps working (its statement exists, made by the protocol).
func TestHandoverRecreatesPgxStatements(t *testing.T) {
	setupSessionState(t)
	for _, withSession := range []bool{false, true} {
		p := newStatePool(t, withSession, false)
		for turn := range 20 {
			for _, tenant := range []string{"a", "b"} {
				ctx := as(tenant)
				if tenant == "a" && turn%2 == 0 {
					// a leaves a statement of its own behind.
					if _, err := p.Exec(ctx, fmt.Sprintf("prepare left_by_a_%d as select 1", turn)); err != nil {
						t.Fatal(err)
					}
				}
				if got := answer(p.QueryRow(ctx, "select $1::text || ' asks'", tenant)); got != tenant+" asks" {
					t.Fatalf("turn %d: %s's query answered %q", turn, tenant, got)
				}
				b := &pgx.Batch{}
				b.Queue("select $1::text || ' asks'", tenant)
				b.Queue("select $1::int + 1", turn)
				br := p.SendBatch(ctx, b)
				var s string
				var n int
				if err := br.QueryRow().Scan(&s); err != nil || s != tenant+" asks" {
					t.Fatalf("turn %d: %s's batch answered %q, %v", turn, tenant, s, err)
				}
				if err := br.QueryRow().Scan(&n); err != nil || n != turn+1 {
					t.Fatalf("turn %d: %s's batch answered %d, %v", turn, tenant, n, err)
				}
				if err := br.Close(); err != nil {
					t.Fatal(err)
				}
				err := pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
					return tx.QueryRow(ctx, "select $1::text || ' asks'", tenant).Scan(&s)
				})
				if err != nil || s != tenant+" asks" {
					t.Fatalf("turn %d: %s's transaction answered %q, %v", turn, tenant, s, err)
				}
				if tenant == "b" {
					var bySQL, byPgx int
					err := p.QueryRow(ctx, "select count(*) filter (where from_sql), count(*) filter (where not from_sql and statement = $1) from pg_prepared_statements",
						"select $1::text || ' asks'").Scan(&bySQL, &byPgx)
					if err != nil {
						t.Fatal(err)
					}
					if bySQL != 0 || byPgx != 1 {
						t.Fatalf("turn %d, Session %v: b's session holds %d statements by SQL (want 0) and %d of pgx's for its query (want 1)",
							turn, withSession, bySQL, byPgx)
					}
				}
			}
		}
		assertNothingHeld(t, p)
	}
}

// TestRecreatedStatementWithOtherColumnsFails: a schema per tenant, where
// the same query returns an integer for tenant a and a real for tenant b.
// pgx prepared the query for a and cached its columns; when b's turn
// re-creates the statement, the server would send b's real where pgx
// decodes a's integer (four bytes either way, so pgx would not notice). b
// must get an error or its own value, never a's type over b's bytes, and
// its next try its own value.
func TestRecreatedStatementWithOtherColumnsFails(t *testing.T) {
	admin, err := pgx.Connect(t.Context(), sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	_, err = admin.Exec(t.Context(), `
		drop schema if exists shape_a cascade; drop schema if exists shape_b cascade;
		create schema shape_a; create schema shape_b;
		create table shape_a.items (v integer); insert into shape_a.items values (7);
		create table shape_b.items (v real); insert into shape_b.items values (2.5)`)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tenantdb.New(context.Background(), pgxConfig(t, sharedPG, 1), tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}},
		Session: tenantdb.Session{
			SearchPath: func(id string) []string { return []string{"shape_" + id} },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	const q = "select v::text, v from items where $1::int > 0"
	read := func(tenant string) (string, error) {
		var text string
		var v any
		err := p.QueryRow(as(tenant), q, 1).Scan(&text, &v)
		return fmt.Sprintf("%s %v", text, v), err
	}
	if got, err := read("a"); err != nil || got != "7 7" {
		t.Fatalf("a read %q, %v", got, err)
	}
	got, err := read("b")
	var pgErr *pgconn.PgError
	switch {
	case err == nil && got != "2.5 2.5":
		t.Fatalf("b read %q: a's column type over b's value", got)
	case err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "0A000"):
		t.Fatalf("b's read failed with %v, want SQLSTATE 0A000", err)
	case err != nil && !strings.Contains(err.Error(), "result columns") && !strings.Contains(err.Error(), "result type"):
		t.Fatalf("b's read failed with %v: it does not say the columns changed", err)
	}
	if got, err := read("b"); err != nil || got != "2.5 2.5" {
		t.Fatalf("b's next read: %q, %v", got, err)
	}
	if got, err := read("a"); err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "0A000") || err == nil && got != "7 7" {
		t.Fatalf("a's read after b's: %q, %v", got, err)
	}
	assertNothingHeld(t, p)
}

// TestLargeResultsAfterChangeOfTenant: rows pass on as they arrive, a
// row larger than one read included, after a change of tenant (when it
// sorts the replies of the reset and of the re-created statement out of
// the stream) and without one, in every exec mode.
func TestLargeResultsAfterChangeOfTenant(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		cfg := pgxConfig(t, sharedPG, 1)
		cfg.ConnConfig.DefaultQueryExecMode = mode
		p, err := tenantdb.New(context.Background(), cfg, tenantdb.Config{
			Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 1}},
			Session: tenantdb.Session{TenantSetting: "app.tenant_id"},
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, tenant := range []string{"a", "a", "b", "a"} {
			var big string
			err := p.QueryRow(as(tenant), "select repeat($1::text, 3000000) || current_setting('app.tenant_id')", "x").Scan(&big)
			if err != nil || len(big) != 3000001 || big[len(big)-1:] != tenant {
				t.Fatalf("%v, %s: a 3 MB value of %d bytes ending %q, %v", mode, tenant, len(big), big[max(len(big)-1, 0):], err)
			}
			rows, _ := p.Query(as(tenant), "select g, current_setting('app.tenant_id') from generate_series(1, $1::int) g", 200000)
			n := 0
			for rows.Next() {
				var g int
				var setting string
				if err := rows.Scan(&g, &setting); err != nil || g != n+1 || setting != tenant {
					t.Fatalf("%v, %s: row %d read %d, %q, %v", mode, tenant, n+1, g, setting, err)
				}
				n++
			}
			if rows.Err() != nil || n != 200000 {
				t.Fatalf("%v, %s: %d rows, %v", mode, tenant, n, rows.Err())
			}
		}
		assertNothingHeld(t, p)
		p.Close()
	}
}

// TestResetUnderThePreviousHoldersTimeouts: the reset runs in the previous
// holder's session, under the statement_timeout it left (1 ms). The next
// tenant's Ping, Exec and Acquire must still work, on the reset session.
func TestResetUnderThePreviousHoldersTimeouts(t *testing.T) {
	p, err := tenantdb.New(context.Background(), pgxConfig(t, sharedPG, 1), tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	calls := map[string]func(ctx context.Context) error{
		"Ping": p.Ping,
		"Exec": func(ctx context.Context) error { _, err := p.Exec(ctx, "select $1::int", 1); return err },
		"Acquire": func(ctx context.Context) error {
			return p.AcquireFunc(ctx, func(c tenantdb.Conn) error { _, err := c.Exec(ctx, "select 1"); return err })
		},
	}
	for name, call := range calls {
		for round := range 10 {
			if _, err := p.Exec(as("a"), "set statement_timeout = '1ms'; set lock_timeout = '1ms'"); err != nil {
				t.Fatal(err)
			}
			if err := call(as("b")); err != nil {
				t.Fatalf("%s, round %d, after a left a 1 ms statement_timeout: %v", name, round, err)
			}
			if got := answer(p.QueryRow(as("b"), "select current_setting('statement_timeout')")); got != "0" {
				t.Fatalf("%s, round %d: b's statement_timeout is %q, want 0", name, round, got)
			}
		}
	}
	assertNothingHeld(t, p)
}
