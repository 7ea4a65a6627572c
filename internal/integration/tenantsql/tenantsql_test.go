package tenantsql_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantsql"
)

// TestRowsHoldTheSlotUntilClosed checks that open Rows hold one of the
// tenant's slots, that a query over the cap fails at once with the tenant's
// *OverLimitError (counted as one rejection: database/sql did not retry it as
// a bad connection), that another tenant is not affected, and that closing
// the rows gives the slot back.
func TestRowsHoldTheSlotUntilClosed(t *testing.T) {
	p := newPool(t, "", 4, tenantdb.Plan{MaxConns: 1}, tenantdb.Session{})
	db := openDB(t, p)

	rows, err := db.QueryContext(as("a"), "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	if n := inUse(p, "a"); n != 1 {
		t.Fatalf("open rows hold %d slots of tenant a; want 1", n)
	}
	_, err = db.ExecContext(as("a"), "select 1")
	var over *tenantdb.OverLimitError
	if !errors.As(err, &over) || !errors.Is(err, tenantdb.ErrOverLimit) || over.Tenant != "a" || over.Limit != 1 {
		t.Fatalf("a second statement of tenant a at its cap of 1: %v; want *tenantdb.OverLimitError for a, limit 1", err)
	}
	if errors.Is(err, driver.ErrBadConn) {
		t.Fatalf("the over-limit error matches driver.ErrBadConn: %v", err)
	}
	if s := p.TenantStat("a"); s.Rejected != 1 {
		t.Fatalf("tenant a has %d rejections; want 1 (database/sql must not retry an over-limit error)", s.Rejected)
	}
	var one int
	if err := db.QueryRowContext(as("b"), "select 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("tenant b while a is at its cap: %d, %v", one, err)
	}

	var got []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
	}
	if err := rows.Err(); err != nil || !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("rows: %v, %v", got, err)
	}
	rows.Close()
	assertReleased(t, p, "a")
	if _, err := db.ExecContext(as("a"), "select 1"); err != nil {
		t.Fatalf("tenant a after its rows were closed: %v", err)
	}
	assertReleased(t, p, "a")
	if s := p.TenantStat("a"); s.Acquired != 2 {
		t.Fatalf("tenant a has %d admissions; want 2 (the rows and the last statement)", s.Acquired)
	}
	if s := db.Stats(); s.Idle != 0 || s.OpenConnections != 0 {
		t.Fatalf("database/sql keeps %d idle of %d open connections; want none", s.Idle, s.OpenConnections)
	}
}

// TestNoTenant checks that a statement, a transaction and a Conn's statement
// without a tenant fail with ErrNoTenant (an empty tenant too), and that a
// Ping without one is a health check that takes no tenant slot, working even
// while every tenant is at its cap.
func TestNoTenant(t *testing.T) {
	p := newPool(t, "", 2, tenantdb.Plan{MaxConns: 1}, tenantdb.Session{})
	db := openDB(t, p)
	bg := context.Background()

	if _, err := db.ExecContext(bg, "select 1"); !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("Exec without a tenant: %v; want ErrNoTenant", err)
	}
	if err := db.QueryRowContext(bg, "select 1").Scan(new(int)); !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("QueryRow without a tenant: %v; want ErrNoTenant", err)
	}
	if _, err := db.BeginTx(bg, nil); !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("BeginTx without a tenant: %v; want ErrNoTenant", err)
	}
	if _, err := db.ExecContext(as(""), "select 1"); !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("Exec with an empty tenant: %v; want ErrNoTenant", err)
	}
	if err := db.PingContext(as("")); !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("Ping with an empty tenant: %v; want ErrNoTenant", err)
	}
	c, err := db.Conn(bg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(bg, "select 1"); !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("a Conn's Exec without a tenant: %v; want ErrNoTenant", err)
	}
	c.Close()

	tx, err := db.BeginTx(as("a"), nil) // tenant a at its cap
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	before := p.Stat().Tenants.Acquired
	if err := db.Ping(); err != nil {
		t.Fatalf("Ping without a tenant: %v", err)
	}
	if err := db.PingContext(bg); err != nil {
		t.Fatalf("PingContext without a tenant: %v", err)
	}
	if after := p.Stat().Tenants.Acquired; after != before {
		t.Fatalf("a Ping without a tenant took %d tenant slots; want none", after-before)
	}
	var over *tenantdb.OverLimitError
	if err := db.PingContext(as("a")); !errors.As(err, &over) {
		t.Fatalf("Ping of tenant a at its cap: %v; want *OverLimitError (a tenant's Ping takes its slot)", err)
	}
	tx.Rollback()
	assertReleased(t, p, "a")
}

// TestTxAndConnHoldTheSlot checks that an sql.Tx and an sql.Conn hold their
// tenant's slot for their lifetime and give it back on Commit, Rollback and
// Close; that a Conn opened without a tenant is bound by its first statement;
// that a Conn's Raw gives the pgx connection (CopyFrom runs on it); and that
// a statement with another tenant's context on them is refused.
func TestTxAndConnHoldTheSlot(t *testing.T) {
	p := newPool(t, "", 4, tenantdb.Plan{MaxConns: 2}, tenantdb.Session{})
	db := openDB(t, p)

	for _, end := range []string{"commit", "rollback"} {
		tx, err := db.BeginTx(as("a"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(as("a"), "select 1"); err != nil {
			t.Fatal(err)
		}
		if n := inUse(p, "a"); n != 1 {
			t.Fatalf("a transaction holds %d slots; want 1", n)
		}
		_, err = tx.ExecContext(as("b"), "select 1")
		if !errors.Is(err, tenantsql.ErrTenantMismatch) {
			t.Fatalf("tenant b's statement in tenant a's transaction: %v; want ErrTenantMismatch", err)
		}
		if end == "commit" {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatalf("%s: %v", end, err)
		}
		assertReleased(t, p, "a")
	}

	c, err := db.Conn(as("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(as("a"), "create temp table tenantsql_copy (n int)"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.ExecContext(as("a"), "select 1"); err != nil {
			t.Fatal(err)
		}
		if n := inUse(p, "a"); n != 1 {
			t.Fatalf("a Conn holds %d slots between statements; want 1", n)
		}
	}
	if err := c.PingContext(as("a")); err != nil {
		t.Fatal(err)
	}
	err = c.Raw(func(dc any) error {
		pc := dc.(interface{ Conn() *pgx.Conn }).Conn()
		n, err := pc.CopyFrom(context.Background(), pgx.Identifier{"tenantsql_copy"}, []string{"n"},
			pgx.CopyFromRows([][]any{{1}, {2}}))
		if err == nil && n != 2 {
			err = fmt.Errorf("copied %d rows; want 2", n)
		}
		return err
	})
	if err != nil {
		t.Fatalf("CopyFrom on the pgx connection of a Conn's Raw: %v", err)
	}
	c.Close()
	assertReleased(t, p, "a")

	c, err = db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n := inUse(p, "a"); n != 0 {
		t.Fatalf("a Conn opened without a tenant holds %d of a's slots", n)
	}
	if _, err := c.ExecContext(as("a"), "select 1"); err != nil {
		t.Fatal(err)
	}
	if n := inUse(p, "a"); n != 1 {
		t.Fatalf("a Conn bound by tenant a's statement holds %d slots; want 1", n)
	}
	if _, err := c.ExecContext(as("b"), "select 1"); !errors.Is(err, tenantsql.ErrTenantMismatch) {
		t.Fatalf("tenant b's statement on tenant a's Conn: %v; want ErrTenantMismatch", err)
	}
	c.Close()
	assertReleased(t, p, "a")
}

// TestScanErrorAndCancelReleaseTheSlot checks the error paths: a Row.Scan
// that fails, Rows closed after a Scan error, a statement whose context is
// cancelled while it runs, and rows whose context is cancelled while they
// are open each give the slot back.
func TestScanErrorAndCancelReleaseTheSlot(t *testing.T) {
	p := newPool(t, "", 4, tenantdb.Plan{MaxConns: 2}, tenantdb.Session{})
	db := openDB(t, p)

	var n int
	if err := db.QueryRowContext(as("a"), "select 'not a number'").Scan(&n); err == nil {
		t.Fatal("scanning text into an int succeeded")
	}
	assertReleased(t, p, "a")

	rows, err := db.QueryContext(as("a"), "select 'x' from generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	if !rows.Next() {
		t.Fatal(rows.Err())
	}
	if err := rows.Scan(&n); err == nil {
		t.Fatal("scanning text into an int succeeded")
	}
	rows.Close()
	assertReleased(t, p, "a")

	ctx, cancel := context.WithCancel(as("a"))
	done := make(chan error, 1)
	go func() {
		_, err := db.ExecContext(ctx, "select pg_sleep(60)")
		done <- err
	}()
	eventually(t, "the sleep holds a slot", func() bool { return inUse(p, "a") == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled statement: %v; want context.Canceled", err)
	}
	eventually(t, "the cancelled statement's slot is back", func() bool { return inUse(p, "a") == 0 })
	assertReleased(t, p, "a")

	ctx, cancel = context.WithCancel(as("a"))
	rows, err = db.QueryContext(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	cancel() // database/sql closes the rows
	eventually(t, "the rows' slot is back after their context was cancelled", func() bool { return inUse(p, "a") == 0 })
	rows.Close()
	assertReleased(t, p, "a")

	ctx, cancel = context.WithCancel(as("a"))
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	cancel() // database/sql rolls the transaction back
	eventually(t, "the transaction's slot is back after its context was cancelled", func() bool { return inUse(p, "a") == 0 })
	if err := tx.Commit(); err == nil {
		t.Fatal("commit after the context was cancelled succeeded")
	}
	assertReleased(t, p, "a")
}

// TestWaitTimeout checks that a statement queued behind the tenant's cap
// fails with the tenant's *OverLimitError after its plan's MaxWait, counted
// as one timeout, and holds nothing afterwards.
func TestWaitTimeout(t *testing.T) {
	p := newPool(t, "", 4, tenantdb.Plan{MaxConns: 1, MaxWaiting: 1, MaxWait: 50 * time.Millisecond}, tenantdb.Session{})
	db := openDB(t, p)
	tx, err := db.BeginTx(as("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.ExecContext(as("a"), "select 1")
	var over *tenantdb.OverLimitError
	if !errors.As(err, &over) || errors.Is(err, driver.ErrBadConn) {
		t.Fatalf("a statement that waited MaxWait: %v; want *tenantdb.OverLimitError", err)
	}
	if s := p.TenantStat("a"); s.TimedOut != 1 {
		t.Fatalf("tenant a has %d timeouts; want 1 (database/sql must not retry it)", s.TimedOut)
	}
	tx.Rollback()
	assertReleased(t, p, "a")
}

// TestNoConnectionMovesBetweenTenants runs tenants a and b in turn through
// one *sql.DB on a single shared connection, with database/sql's idle pool
// turned back on by the caller: each statement still sees its own tenant's
// setting and rows, and database/sql keeps no connection idle.
func TestNoConnectionMovesBetweenTenants(t *testing.T) {
	dsn := setupRLS(t)
	p := newPool(t, dsn, 1, tenantdb.Plan{MaxConns: 1}, rlsSession)
	db := openDB(t, p)
	db.SetMaxIdleConns(10)
	want := map[string]string{"a": "a1,a2", "b": "b1"}
	for i := range 6 {
		tenant := []string{"a", "b"}[i%2]
		c, err := db.Conn(as(tenant))
		if err != nil {
			t.Fatal(err)
		}
		var setting, bodies string
		err = c.QueryRowContext(as(tenant), "select current_setting('app.tenant_id'), string_agg(body, ',' order by body) from docs").Scan(&setting, &bodies)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if setting != tenant || bodies != want[tenant] {
			t.Fatalf("tenant %s saw setting %q and rows %s; want %q and %s", tenant, setting, bodies, tenant, want[tenant])
		}
		if s := db.Stats(); s.Idle != 0 {
			t.Fatalf("database/sql keeps %d idle connections; want none", s.Idle)
		}
	}
	assertReleased(t, p, "a")
	assertReleased(t, p, "b")
}

// TestClosedPool checks that statements after the Pool's Close fail with
// ErrClosed, not a retried bad connection.
func TestClosedPool(t *testing.T) {
	p := newPool(t, "", 2, tenantdb.Plan{MaxConns: 1}, tenantdb.Session{})
	db := openDB(t, p)
	p.Close()
	if _, err := db.ExecContext(as("a"), "select 1"); !errors.Is(err, tenantdb.ErrClosed) {
		t.Fatalf("Exec after Close: %v; want ErrClosed", err)
	}
	if err := db.Ping(); !errors.Is(err, tenantdb.ErrClosed) {
		t.Fatalf("Ping after Close: %v; want ErrClosed", err)
	}
}

// TestMaxOpenConnsQueue checks the connections database/sql's own opener
// makes for callers queued behind SetMaxOpenConns, with no tenant in their
// context: each is bound by the queued call's tenant, whose statement sees
// its own setting, and nothing stays held.
func TestMaxOpenConnsQueue(t *testing.T) {
	dsn := setupRLS(t)
	p := newPool(t, dsn, 2, tenantdb.Plan{MaxConns: 1}, rlsSession)
	db := openDB(t, p)
	db.SetMaxOpenConns(1)
	tx, err := db.BeginTx(as("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		var s string
		err := db.QueryRowContext(as("b"), "select current_setting('app.tenant_id')").Scan(&s)
		errc <- err
		got <- s
	}()
	eventually(t, "tenant b waits in database/sql's queue", func() bool { return db.Stats().WaitCount == 1 })
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("tenant b queued behind SetMaxOpenConns: %v", err)
	}
	if s := <-got; s != "b" {
		t.Fatalf("tenant b queued behind SetMaxOpenConns saw setting %q; want b", s)
	}
	assertReleased(t, p, "a")
	assertReleased(t, p, "b")
}
