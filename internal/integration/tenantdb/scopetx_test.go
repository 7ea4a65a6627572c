package tenantdb_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/internal/pgtest"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// countUploads returns the rows of tenant's own uploads table, read as tenant.
func countUploads(t *testing.T, p *tenantdb.Pool, tenant string) int {
	t.Helper()
	var n int
	if err := p.QueryRow(as(tenant), "select count(*) from uploads").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCopyFromInsideATransaction: a Conn's CopyFrom inside a transaction
// begun on it is part of that transaction under both scopes: a rollback
// takes the copied rows with it (ScopeTransaction committed them, and the
// transaction's first row, with a COPY of its own).
func TestCopyFromInsideATransaction(t *testing.T) {
	dsn := setupRLS(t)
	for _, scope := range []tenantdb.Scope{tenantdb.ScopeSession, tenantdb.ScopeTransaction} {
		t.Run(scopeName(scope), func(t *testing.T) {
			p := newScopedRLSPool(t, dsn, 1, scope, nil)
			ctx := as("a")
			before := countUploads(t, p, "a")
			err := p.AcquireFunc(ctx, func(c tenantdb.Conn) error {
				tx, err := c.Begin(ctx)
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, "insert into uploads values ('in the transaction')"); err != nil {
					return err
				}
				n, err := c.CopyFrom(ctx, pgx.Identifier{"uploads"}, []string{"name"}, pgx.CopyFromRows([][]any{{"c1"}, {"c2"}}))
				if err != nil || n != 2 {
					t.Errorf("CopyFrom in the transaction: %d rows, %v", n, err)
				}
				var inTx int
				if err := tx.QueryRow(ctx, "select count(*) from uploads").Scan(&inTx); err != nil || inTx != before+3 {
					t.Errorf("the transaction sees %d rows after the copy, %v; want %d", inTx, err, before+3)
				}
				return tx.Rollback(ctx)
			})
			if err != nil {
				t.Fatal(err)
			}
			if after := countUploads(t, p, "a"); after != before {
				t.Errorf("after the rollback: %d rows, want %d (the transaction's rows were committed)", after, before)
			}
			// Outside a transaction, ScopeTransaction's own one still commits.
			err = p.AcquireFunc(ctx, func(c tenantdb.Conn) error {
				_, err := c.CopyFrom(ctx, pgx.Identifier{"uploads"}, []string{"name"}, pgx.CopyFromRows([][]any{{"c3"}}))
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if after := countUploads(t, p, "a"); after != before+1 {
				t.Errorf("a CopyFrom outside a transaction: %d rows, want %d", after, before+1)
			}
			assertNothingHeld(t, p)
		})
	}
}

// TestFailedTransactionRecovers: on a Conn, a transaction whose statement
// failed recovers with ROLLBACK TO SAVEPOINT and ends with ROLLBACK under
// both scopes (ScopeTransaction put its setting in front of them, which
// PostgreSQL refused with 25P02), and the statements after the recovery
// still see the tenant's rows and schema.
func TestFailedTransactionRecovers(t *testing.T) {
	dsn := setupRLS(t)
	for _, scope := range []tenantdb.Scope{tenantdb.ScopeSession, tenantdb.ScopeTransaction} {
		t.Run(scopeName(scope), func(t *testing.T) {
			p := newScopedRLSPool(t, dsn, 1, scope, nil)
			ctx := as("a")
			for _, begin := range []string{"Conn.Begin", "SQL begin"} {
				err := p.AcquireFunc(ctx, func(c tenantdb.Conn) error {
					exec := func(sql string, args ...any) error {
						_, err := c.Exec(ctx, sql, args...)
						return err
					}
					var tx pgx.Tx
					var err error
					if begin == "Conn.Begin" {
						tx, err = c.Begin(ctx)
					} else {
						err = exec("begin")
					}
					if err != nil {
						return err
					}
					if err := exec("insert into uploads values ('kept until the rollback')"); err != nil {
						return err
					}
					if err := exec("savepoint s"); err != nil {
						return err
					}
					var pgErr *pgconn.PgError
					if err := exec("select 1/0"); !errors.As(err, &pgErr) || pgErr.Code != "22012" {
						t.Errorf("%s: select 1/0: %v, want division_by_zero", begin, err)
					}
					if err := exec("rollback to savepoint s"); err != nil {
						t.Errorf("%s: rollback to savepoint in the failed transaction: %v", begin, err)
						if tx != nil {
							return tx.Rollback(ctx)
						}
						return exec("rollback")
					}
					var tenants []string
					var item string
					err = c.QueryRow(ctx, probe+" where $1::int = 1", 1).Scan(&tenants, &item)
					checkProbe(t, "a", begin+": QueryRow after the recovery", tenants, item, err)
					var n int
					if err := c.QueryRow(ctx, "select count(*) from uploads where name = $1", "kept until the rollback").Scan(&n); err != nil || n != 1 {
						t.Errorf("%s: the transaction's row after the recovery: %d, %v", begin, n, err)
					}
					// Fail again, and end the transaction from the failed state.
					if err := exec("select 1/0"); err == nil {
						t.Errorf("%s: the second select 1/0 succeeded", begin)
					}
					if tx != nil {
						return tx.Rollback(ctx)
					}
					return exec("rollback")
				})
				if err != nil {
					t.Errorf("%s: %v", begin, err)
				}
				var n int
				if err := p.QueryRow(ctx, "select count(*) from uploads where name = $1", "kept until the rollback").Scan(&n); err != nil || n != 0 {
					t.Errorf("%s: rows of the rolled back transaction: %d, %v", begin, n, err)
				}
				assertNothingHeld(t, p)
			}
		})
	}
}

// TestStatementsThatCannotRunInATransaction: under ScopeTransaction, which
// runs every statement in a transaction with the tenant's settings,
// CREATE INDEX CONCURRENTLY, DROP INDEX CONCURRENTLY and VACUUM fail with
// ErrCannotRunInTransaction, whose message says what to use instead, and
// nothing of the call stays behind; ScopeSession runs them.
func TestStatementsThatCannotRunInATransaction(t *testing.T) {
	setupRLS(t)
	dsn := pgtest.AppRole(t, sharedPG.DSN, rlsRole, "create table tenant_a.maint (name text); alter table tenant_a.maint owner to "+rlsRole+"; grant create on schema tenant_a to "+rlsRole)
	statements := []string{
		"create index concurrently maint_name on maint (name)",
		"drop index concurrently maint_name",
		"vacuum maint",
	}
	for _, scope := range []tenantdb.Scope{tenantdb.ScopeSession, tenantdb.ScopeTransaction} {
		t.Run(scopeName(scope), func(t *testing.T) {
			p := newScopedRLSPool(t, dsn, 1, scope, nil)
			ctx := as("a")
			for _, sql := range statements {
				_, err := p.Exec(ctx, sql)
				if scope == tenantdb.ScopeSession {
					if err != nil {
						t.Errorf("ScopeSession: %s: %v", sql, err)
					}
					continue
				}
				var pgErr *pgconn.PgError
				if !errors.Is(err, tenantdb.ErrCannotRunInTransaction) || !errors.As(err, &pgErr) || pgErr.Code != "25001" ||
					!strings.Contains(err.Error(), "Pgxpool") {
					t.Errorf("ScopeTransaction: %s: %v; want ErrCannotRunInTransaction with the server's 25001, naming Pgxpool", sql, err)
				}
			}
			assertNothingHeld(t, p)
		})
	}
}
