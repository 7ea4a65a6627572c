package tenantsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tenantdb/tenantsql"
)

// TestPlainBeginBehindPgBouncer: under ScopeTransaction, a transaction begun
// with an SQL BEGIN of its own (on an sql.Conn, as a migration tool or
// hand-written code may do) carries the tenant's values for all its
// statements, through PgBouncer in transaction pooling with two server
// connections and tenants a and b at once, whatever the spelling of the
// BEGIN; its writes get the tenant's column default and pass the policy's
// check.
func TestPlainBeginBehindPgBouncer(t *testing.T) {
	setupRLS(t)
	bouncer := tenantdbtest.StartPgBouncer(t, sharedPG,
		tenantdbtest.WithPoolMode(tenantdbtest.PoolModeTransaction),
		tenantdbtest.WithPoolSize(2),
		tenantdbtest.WithPgBouncerUser(rlsRole, "app"))
	pcfg, err := pgxpool.ParseConfig(bouncer.DSNFor(rlsRole, "app") + "&default_query_exec_mode=exec")
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 4
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 2, MaxWaiting: 10, MaxWait: time.Minute}},
		Session: scopeTx,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	db := openDB(t, p)

	begins := []string{"BEGIN", "begin isolation level repeatable read", "START TRANSACTION", "/* hand-written */ begin;"}
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for _, tenant := range []string{"a", "b", "a", "b", "a", "b"} {
		wg.Go(func() {
			for i := range 12 {
				if err := plainBegin(as(tenant), db, tenant, begins[i%len(begins)], i%2 == 0); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The committed rows were written as their tenants.
	for tenant, want := range map[string]int{"a": 2 + 3*6, "b": 1 + 3*6} {
		var n int
		if err := db.QueryRowContext(as(tenant), "select count(*) from docs where tenant = $1", tenant).Scan(&n); err != nil || n != want {
			t.Errorf("tenant %s has %d rows (%v), want %d", tenant, n, err, want)
		}
	}
	assertReleased(t, p, "a")
	assertReleased(t, p, "b")
}

// plainBegin begins a transaction with the SQL begin on a connection of db,
// checks that each of its statements runs with tenant's setting and sees
// tenant's rows only, writes one row and commits or rolls back.
func plainBegin(ctx context.Context, db *sql.DB, tenant, begin string, commit bool) error {
	c, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, begin); err != nil {
		return fmt.Errorf("%s as %s: %w", begin, tenant, err)
	}
	check := func(what string) error {
		var setting string
		var others int
		err := c.QueryRowContext(ctx, "select current_setting('app.tenant_id', true), count(*) filter (where tenant <> $1) from docs", tenant).
			Scan(&setting, &others)
		if err != nil {
			return fmt.Errorf("after %q as %s, %s: %w", begin, tenant, what, err)
		}
		if setting != tenant || others != 0 {
			return fmt.Errorf("after %q as %s, %s: setting %q and %d rows of other tenants", begin, tenant, what, setting, others)
		}
		return nil
	}
	if err := check("the first statement"); err != nil {
		return err
	}
	if _, err := c.ExecContext(ctx, "insert into docs (body) values ($1)", "by "+tenant); err != nil {
		return fmt.Errorf("insert after %q as %s: %w", begin, tenant, err)
	}
	if err := check("after an insert"); err != nil {
		return err
	}
	end := "rollback"
	if commit {
		end = "commit"
	}
	if _, err := c.ExecContext(ctx, end); err != nil {
		return fmt.Errorf("%s after %q as %s: %w", end, begin, tenant, err)
	}
	return nil
}

// TestBeginWithQueryRefused: under ScopeTransaction a BEGIN sent with
// QueryContext would join the transaction QueryContext opens for the
// tenant's values, losing its isolation level and ending with its rows: it
// fails with ErrBeginWithQuery and holds nothing.
func TestBeginWithQueryRefused(t *testing.T) {
	dsn := setupRLS(t)
	p := newPool(t, dsn+"&default_query_exec_mode=exec", 2, tenantdb.Plan{MaxConns: 1}, scopeTx)
	db := openDB(t, p)
	c, err := db.Conn(as("a"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := c.QueryContext(as("a"), "begin isolation level serializable")
	if err == nil {
		rows.Close()
	}
	if !errors.Is(err, tenantsql.ErrBeginWithQuery) {
		t.Fatalf("QueryContext(begin): err = %v, want ErrBeginWithQuery", err)
	}
	var n int
	if err := c.QueryRowContext(as("a"), "select count(*) from docs").Scan(&n); err != nil || n != 2 {
		t.Fatalf("the connection afterwards counts %d rows of a (%v), want 2", n, err)
	}
	c.Close()
	assertReleased(t, p, "a")
}
