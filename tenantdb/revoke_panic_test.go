package tenantdb_test

import (
	"context"
	"database/sql/driver"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// neverRevoked is a cluster limiter whose leases are revocable but never
// revoked: it sends every call down the guarded paths (tenantdb acquires the
// connection itself, to be able to cancel the statement on it) without Redis.
type neverRevoked struct{}

type neverRevokedLease struct{}

func (neverRevokedLease) Release()              {}
func (neverRevokedLease) Local() bool           { return false }
func (neverRevokedLease) Done() <-chan struct{} { return make(chan struct{}) }

func (neverRevoked) AcquireSlot(context.Context, string, int, time.Duration) (pool.ClusterLease, error) {
	return neverRevokedLease{}, nil
}

type panicValuer struct{}

func (panicValuer) Value() (driver.Value, error) { panic("boom") }

type panicScanner struct{}

func (*panicScanner) Scan(any) error { panic("boom") }

// TestGuardedPathsReleaseOnPanic: under a revocable cluster lease, a panic in
// the caller's code that pgx runs in the caller's goroutine (an argument's
// Valuer, a Scanner) returns both the tenant slot and the shared connection,
// as pgxpool's own paths do. (pgx reads a CopyFromSource in a goroutine of
// its own, where a panic ends the process.)
func TestGuardedPathsReleaseOnPanic(t *testing.T) {
	p := newPool(t, sharedPG, 4, tenantdb.Config{
		Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 2}},
		Cluster: neverRevoked{},
	})
	ctx := as("acme")
	mustPanic := func(t *testing.T, f func()) {
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

	t.Run("Exec with a panicking Valuer", func(t *testing.T) {
		mustPanic(t, func() { _, _ = p.Exec(ctx, "select $1::text", panicValuer{}) })
		assertInUse(t, p, "acme", 0, "after a panic in Exec")
	})
	t.Run("QueryRow with a panicking Scanner", func(t *testing.T) {
		mustPanic(t, func() { _ = p.QueryRow(ctx, "select 1").Scan(&panicScanner{}) })
		assertInUse(t, p, "acme", 0, "after a panic in QueryRow's Scan")
	})
	// The pool still serves the tenant up to its cap.
	for range 2 {
		if _, err := p.Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
	}
}
