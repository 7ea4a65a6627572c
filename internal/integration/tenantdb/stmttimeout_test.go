package tenantdb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestStatementTimeout: under both scopes, a runaway statement of a tenant
// whose plan has a 200 ms StatementTimeout ends with ErrStatementTimeout
// (and PostgreSQL's 57014) through Exec, Query and a transaction, with its
// slot back when the call returns; another tenant on the same (only)
// connection right after it runs under its own timeout, not the first's,
// and a Lookup override and a class's timeout apply to their own calls.
func TestStatementTimeout(t *testing.T) {
	var serverDefault string
	if err := rawPool(t, sharedPG, 1).QueryRow(context.Background(), "show statement_timeout").Scan(&serverDefault); err != nil {
		t.Fatal(err)
	}
	for _, scope := range []tenantdb.Scope{tenantdb.ScopeSession, tenantdb.ScopeTransaction} {
		t.Run(scopeName(scope), func(t *testing.T) {
			pcfg := pgxConfig(t, sharedPG, 1)
			if scope == tenantdb.ScopeTransaction {
				pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
			}
			p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
				Plans: map[string]pool.Plan{
					"free": {MaxConns: 1, StatementTimeout: 200 * time.Millisecond},
					"paid": {MaxConns: 1},
				},
				DefaultPlan: "paid",
				Classes:     map[string]pool.Class{"report": {MaxConns: 1, StatementTimeout: 100 * time.Millisecond}},
				Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
					switch id {
					case "a":
						return pool.Tenant{Plan: "free"}, nil
					case "c":
						return pool.Tenant{StatementTimeout: 300 * time.Millisecond}, nil
					}
					return pool.Tenant{}, nil
				},
				Session: tenantdb.Session{Scope: scope, TenantSetting: "app.tenant"},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)

			timedOut := func(what string, err error) {
				t.Helper()
				var pgErr *pgconn.PgError
				if !errors.Is(err, tenantdb.ErrStatementTimeout) || !errors.As(err, &pgErr) || pgErr.Code != "57014" {
					t.Fatalf("%s: %v, want ErrStatementTimeout with SQLSTATE 57014", what, err)
				}
				if s := p.TenantStat("a"); s.InUse != 0 {
					t.Fatalf("%s: tenant a holds %d slots after the call returned, want 0", what, s.InUse)
				}
			}
			show := func(ctx context.Context) string {
				t.Helper()
				var v string
				if err := p.QueryRow(ctx, "select current_setting('statement_timeout')").Scan(&v); err != nil {
					t.Fatal(err)
				}
				return v
			}

			began := time.Now()
			_, err = p.Exec(as("a"), "select pg_sleep(3600)")
			timedOut("Exec", err)
			t.Logf("pg_sleep(3600) under a 200 ms StatementTimeout returned after %v", time.Since(began).Round(time.Millisecond))

			// b, on the same connection, runs under the server's timeout and
			// outlives a's 200 ms.
			if got := show(as("b")); got != serverDefault {
				t.Errorf("tenant b after a: statement_timeout %q, want the server's %q", got, serverDefault)
			}
			if _, err := p.Exec(as("b"), "select pg_sleep(0.4)"); err != nil {
				t.Errorf("tenant b's 400 ms statement after a's: %v", err)
			}

			rows, err := p.Query(as("a"), "select pg_sleep(3600)")
			if err == nil {
				for rows.Next() {
				}
				err = rows.Err()
				rows.Close()
			}
			timedOut("Query", err)

			err = pgx.BeginFunc(as("a"), p, func(tx pgx.Tx) error {
				_, err := tx.Exec(as("a"), "select pg_sleep(3600)")
				return err
			})
			timedOut("a transaction", err)

			if got := show(as("a")); got != "200ms" {
				t.Errorf("tenant a: statement_timeout %q, want 200ms", got)
			}
			if got := show(as("c")); got != "300ms" {
				t.Errorf("tenant c (Lookup's override): statement_timeout %q, want 300ms", got)
			}
			if got := show(tenantdb.WithClass(as("a"), "report")); got != "100ms" {
				t.Errorf("tenant a's class report: statement_timeout %q, want 100ms", got)
			}
			if got := show(as("b")); got != serverDefault {
				t.Errorf("tenant b after the others: statement_timeout %q, want the server's %q", got, serverDefault)
			}
			assertNothingHeld(t, p)
		})
	}
}
