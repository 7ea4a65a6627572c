package tenantsql_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestStatementTimeoutThroughDatabaseSQL: under ScopeSession, a plan's
// StatementTimeout reaches the connection tenantsql acquires for the
// tenant (Slot.AcquireContext), and a runaway statement ends with the
// server's 57014 and its slot back.
func TestStatementTimeoutThroughDatabaseSQL(t *testing.T) {
	p := newPool(t, "", 2, tenantdb.Plan{MaxConns: 1, StatementTimeout: 150 * time.Millisecond},
		tenantdb.Session{TenantSetting: "app.tenant"})
	db := openDB(t, p)
	var got string
	if err := db.QueryRowContext(as("a"), "select current_setting('statement_timeout')").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "150ms" {
		t.Errorf("statement_timeout %q through database/sql, want 150ms", got)
	}
	_, err := db.ExecContext(as("a"), "select pg_sleep(3600)")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("a runaway statement through database/sql: %v, want SQLSTATE 57014", err)
	}
	assertReleased(t, p, "a")
}
