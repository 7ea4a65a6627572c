package tenantsql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestIdleTransactionThroughDatabaseSQL: an sql.Tx left idle past its
// tenant's IdleInTransactionTimeout is rolled back and its slot and
// connection returned, in both scopes; its later statements, its prepared
// statement and its Commit fail with ErrIdleInTransaction (and
// sql.ErrConnDone), its insert is gone and TenantStat counts it. Rows left
// open keep the hold: a transaction whose rows are open past the timeout
// is not ended under them.
func TestIdleTransactionThroughDatabaseSQL(t *testing.T) {
	const idle = 300 * time.Millisecond
	for name, scope := range map[string]tenantdb.Scope{"ScopeSession": tenantdb.ScopeSession, "ScopeTransaction": tenantdb.ScopeTransaction} {
		t.Run(name, func(t *testing.T) {
			pcfg, err := pgxpool.ParseConfig(sharedPG.DSN)
			if err != nil {
				t.Fatal(err)
			}
			pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // as ScopeTransaction needs
			pcfg.MaxConns = 2
			p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
				Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 1, IdleInTransactionTimeout: idle}},
				Session: tenantdb.Session{Scope: scope, TenantSetting: "app.tenant"},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			db := openDB(t, p)
			if _, err := db.ExecContext(as("b"), "drop table if exists hold_sql; create table hold_sql (x int)"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = db.ExecContext(as("b"), "drop table if exists hold_sql") })

			// Open rows keep the transaction: they outlive the timeout.
			tx, err := db.BeginTx(as("a"), nil)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := tx.QueryContext(as("a"), "select 1 union all select 2")
			if err != nil {
				t.Fatal(err)
			}
			rows.Next()
			began := time.Now()
			eventually(t, "twice the timeout passes", func() bool { return time.Since(began) > 2*idle })
			for rows.Next() {
			}
			if err := rows.Close(); err != nil {
				t.Fatalf("rows open past the timeout: %v", err)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatalf("a transaction whose rows were open past the timeout: %v", err)
			}

			// Left idle, it is ended.
			tx, err = db.BeginTx(as("a"), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback() // on a failure; after the end it does nothing
			if _, err := tx.ExecContext(as("a"), "insert into hold_sql values (1)"); err != nil {
				t.Fatal(err)
			}
			st, err := tx.PrepareContext(as("a"), "select $1::int")
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "the idle transaction's slot is back", func() bool { return inUse(p, "a") == 0 })
			if _, err := st.ExecContext(as("a"), 1); !errors.Is(err, tenantdb.ErrIdleInTransaction) {
				t.Errorf("a prepared statement after the end: %v, want ErrIdleInTransaction", err)
			}
			if err := st.Close(); err != nil {
				t.Errorf("closing a prepared statement after the end: %v", err)
			}
			_, err = tx.ExecContext(as("a"), "select 1")
			if !errors.Is(err, tenantdb.ErrIdleInTransaction) || !errors.Is(err, sql.ErrConnDone) {
				t.Errorf("a statement after the end: %v, want ErrIdleInTransaction and sql.ErrConnDone", err)
			}
			if err := tx.Commit(); !errors.Is(err, tenantdb.ErrIdleInTransaction) {
				t.Errorf("Commit after the end: %v, want ErrIdleInTransaction", err)
			}
			var n int
			if err := db.QueryRowContext(as("b"), "select count(*) from hold_sql").Scan(&n); err != nil || n != 0 {
				t.Errorf("rows left by the ended transaction: %d (%v), want 0", n, err)
			}
			if s := p.TenantStat("a"); s.IdleTimeouts != 1 {
				t.Errorf("IdleTimeouts %d, want 1", s.IdleTimeouts)
			}
			assertReleased(t, p, "a")
		})
	}
}

// TestMaxHoldThroughDatabaseSQL: an sql.Conn held past its tenant's
// MaxHold, outside a transaction, is given back; its later statements fail
// with ErrMaxHold and its Close does nothing more.
func TestMaxHoldThroughDatabaseSQL(t *testing.T) {
	p := newPool(t, "", 2, tenantdb.Plan{MaxConns: 1, MaxHold: 300 * time.Millisecond}, tenantdb.Session{TenantSetting: "app.tenant"})
	db := openDB(t, p)
	c, err := db.Conn(as("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close() // on a failure; a second Close does nothing
	if _, err := c.ExecContext(as("a"), "select 1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the held connection's slot is back", func() bool { return inUse(p, "a") == 0 })
	if _, err := c.ExecContext(as("a"), "select 1"); !errors.Is(err, tenantdb.ErrMaxHold) {
		t.Errorf("a statement after MaxHold: %v, want ErrMaxHold", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close after MaxHold: %v", err)
	}
	if _, err := db.ExecContext(as("a"), "select 1"); err != nil {
		t.Errorf("the tenant after its connection was ended: %v", err)
	}
	if s := p.TenantStat("a"); s.HoldTimeouts != 1 {
		t.Errorf("HoldTimeouts %d, want 1", s.HoldTimeouts)
	}
	assertReleased(t, p, "a")
}
