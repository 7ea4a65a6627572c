package tenantdb_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestRoleDefaultsSetByATenantAreRefused: tenant a's SQL, run as the shared
// login role (an ordinary one), changes that role's own default search_path
// to put a's schema first. No reset undoes it (DISCARD ALL restores the
// default), and every connection opened after it would start that way for
// every tenant. The Pool must refuse such a connection, with
// ErrRoleDefaultsChanged, rather than give b a session whose search_path a
// chose; and open connections again once the default is put back.
func TestRoleDefaultsSetByATenantAreRefused(t *testing.T) {
	setupSessionState(t)
	admin, err := pgx.Connect(t.Context(), sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	reset := func() {
		if _, err := admin.Exec(context.Background(), "alter role "+rlsRole+" reset search_path"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(reset)
	p := newStatePool(t, false, false)
	const path = "select current_setting('search_path')"
	before := answer(p.QueryRow(as("b"), path))
	if _, err := p.Exec(as("a"), "alter role current_user set search_path = tenant_a, public"); err != nil {
		t.Fatalf("the login role could not change its own default (the test would prove nothing): %v", err)
	}
	p.Pgxpool().Reset() // every connection is opened again
	var got string
	err = p.QueryRow(as("b"), path).Scan(&got)
	if !errors.Is(err, tenantdb.ErrRoleDefaultsChanged) {
		t.Fatalf("after a changed the login role's default search_path, b's read on a new connection: %q, %v; want ErrRoleDefaultsChanged", got, err)
	}
	assertNothingHeld(t, p)
	reset()
	if got := answer(p.QueryRow(as("b"), path)); got != before {
		t.Fatalf("with the default put back, b's search_path is %q, want %q", got, before)
	}
	assertNothingHeld(t, p)
}
