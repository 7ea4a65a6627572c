package tenantdb_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb"
)

type panicValuer struct{}

func (panicValuer) Value() (driver.Value, error) { panic("boom") }

type panicScanner struct{}

func (*panicScanner) Scan(any) error { panic("boom") }

func mustPanic(t *testing.T, f func()) {
	t.Helper()
	panicked := true
	func() {
		defer func() {
			if recover() == nil {
				panicked = false
			}
		}()
		f()
	}()
	if !panicked {
		t.Fatal("the call did not panic")
	}
}

// closeWithin closes p and fails the test if Close does not return: it
// waits for every shared connection to come back, so a leaked one hangs it.
func closeWithin(t *testing.T, p *tenantdb.Pool, limit time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("Pool.Close did not return within %v: a connection was never released", limit)
	}
}

// TestScanErrorReleasesSlot: a Scan error closes pgx's rows, and the
// usual loop `for rows.Next() { if err := rows.Scan(...); err != nil {
// return err } }` never calls Close: the slot must come back all the same.
func TestScanErrorReleasesSlot(t *testing.T) {
	p := newPool(t, sharedPG, 2, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}}})
	ctx := as("acme")
	read := func() error {
		rows, err := p.Query(ctx, "select null::int from generate_series(1, 3)")
		if err != nil {
			return err
		}
		for rows.Next() {
			var n int
			if err := rows.Scan(&n); err != nil {
				return err // no Close, as in most code
			}
		}
		return rows.Err()
	}
	for i := range 3 { // cap 1: a leaked slot rejects the second round
		if err := read(); err == nil || errors.Is(err, tenantdb.ErrOverLimit) {
			t.Fatalf("round %d: err = %v, want the Scan error", i, err)
		}
		assertInUse(t, p, "acme", 0, "after a Scan error without Close")
	}
	rows, err := p.Query(ctx, "select 'x'")
	if err != nil {
		t.Fatal(err)
	}
	if !rows.Next() {
		t.Fatal(rows.Err())
	}
	if _, err := rows.Values(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	assertInUse(t, p, "acme", 0, "after Values and Close")
}

// TestPanicsReleaseSlots: a panic in the caller's code that pgx runs in the
// caller's goroutine (an argument's Valuer, a Scanner, a batch callback, the
// pgxpool.Config's own PrepareConn or BeforeAcquire) returns both the tenant
// slot and the shared connection: the pool keeps serving the tenant, and
// Close does not wait for a lost connection.
func TestPanicsReleaseSlots(t *testing.T) {
	p := newPool(t, sharedPG, 2, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}}})
	ctx := as("acme")
	cases := map[string]func(){
		"Exec with a panicking Valuer":     func() { _, _ = p.Exec(ctx, "select $1::text", panicValuer{}) },
		"Query with a panicking Valuer":    func() { _, _ = p.Query(ctx, "select $1::text", panicValuer{}) },
		"QueryRow with a panicking Valuer": func() { _ = p.QueryRow(ctx, "select $1::text", panicValuer{}).Scan(new(string)) },
		"QueryRow with a panicking Scanner": func() {
			_ = p.QueryRow(ctx, "select 1").Scan(&panicScanner{})
		},
		"Query with a panicking Scanner": func() {
			rows, _ := p.Query(ctx, "select 1")
			defer rows.Close()
			for rows.Next() {
				_ = rows.Scan(&panicScanner{})
			}
		},
		"SendBatch with a panicking Valuer": func() {
			b := &pgx.Batch{}
			b.Queue("select $1::text", panicValuer{})
			_ = p.SendBatch(ctx, b).Close()
		},
		"a batch callback panicking in Close": func() {
			b := &pgx.Batch{}
			b.Queue("select 1").QueryRow(func(pgx.Row) error { panic("boom") })
			b.Queue("select 2")
			_ = p.SendBatch(ctx, b).Close()
		},
		"AcquireFunc": func() {
			_ = p.AcquireFunc(ctx, func(tenantdb.Conn) error { panic("boom") })
		},
		"BeginFunc": func() {
			_ = pgx.BeginFunc(ctx, p, func(pgx.Tx) error { panic("boom") })
		},
	}
	cases["a batch that begins a transaction, callback panicking in Close"] = func() {
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		b.Queue("select 1").QueryRow(func(pgx.Row) error { panic("boom") })
		_ = p.SendBatch(ctx, b).Close()
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			mustPanic(t, f)
			assertInUse(t, p, "acme", 0, "after the panic")
			if _, err := p.Exec(ctx, "select 1"); err != nil {
				t.Fatalf("the tenant's next call: %v", err)
			}
		})
	}
	closeWithin(t, p, time.Minute)
}

// TestUserPrepareConnPanicReleases: a panic in the pgxpool.Config's own
// PrepareConn or BeforeAcquire fails that call with an error; it neither
// unwinds through pgxpool (which would lose the connection) nor keeps the
// tenant's slot.
func TestUserPrepareConnPanicReleases(t *testing.T) {
	for _, hook := range []string{"PrepareConn", "BeforeAcquire"} {
		t.Run(hook, func(t *testing.T) {
			pcfg := pgxConfig(t, sharedPG, 1)
			boom := func(ctx context.Context) bool {
				id, _ := tenantdb.TenantFrom(ctx)
				if id == "boom" {
					panic("the user's hook")
				}
				return true
			}
			if hook == "PrepareConn" {
				pcfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) { return boom(ctx), nil }
			} else {
				pcfg.BeforeAcquire = func(ctx context.Context, _ *pgx.Conn) bool { return boom(ctx) }
			}
			p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}}})
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				_, err := p.Exec(as("boom"), "select 1")
				if err == nil || !strings.Contains(err.Error(), "panicked") {
					t.Fatalf("err = %v, want the hook's panic as an error", err)
				}
				assertInUse(t, p, "boom", 0, "after the hook panicked")
			}
			if _, err := p.Exec(as("fine"), "select 1"); err != nil {
				t.Fatalf("another tenant on the one shared connection: %v", err)
			}
			closeWithin(t, p, time.Minute)
		})
	}
}
