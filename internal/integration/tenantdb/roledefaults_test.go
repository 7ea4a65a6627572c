package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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

// defaultsRole is the login role of the tests of issue 51's item 3, and
// defaultsDB tenant's database there.
const defaultsRole = "tenantdb_defects_defaults_app"

func defaultsDB(tenant string) (string, error) { return "tenantdb_defects_" + tenant, nil }

// defaultsPool is a Pool with Config.Database as defaultsRole over the
// databases of tenants a, c and d, with the role's defaults in them put
// back now and when the test ends; and a superuser connection.
func defaultsPool(t *testing.T, session tenantdb.Session) (*tenantdb.Pool, *pgx.Conn) {
	t.Helper()
	var dbs []string
	for _, tenant := range []string{"a", "c", "d"} {
		db, _ := defaultsDB(tenant)
		dbs = append(dbs, db)
	}
	admin := defectDatabases(t, dbs...)
	pcfg := loginAs(t, defaultsRole, 4)
	putBack := func() {
		for _, db := range dbs {
			if _, err := admin.Exec(context.Background(), "alter role "+defaultsRole+" in database "+db+" reset all"); err != nil {
				t.Fatal(err)
			}
		}
	}
	putBack()
	t.Cleanup(putBack)
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:    map[string]tenantdb.Plan{"p": {MaxConns: 2}},
		Database: defaultsDB,
		Session:  session,
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, admin
}

// defaultsProbe shows the two defaults tenant a sets for d's database.
const defaultsProbe = "select current_setting('default_transaction_read_only') || ' ' || current_setting('search_path')"

// TestRoleDefaultsOfAnotherDatabaseAreRefused is issue 51's item 3: tenant
// a, whose SQL runs as the shared login role, sets that role's defaults in
// the databases of tenants c (connected already) and d (never connected
// yet). d must never run with them: its first connection is refused, as
// c's next one is, with ErrRoleDefaultsChanged naming the database and the
// settings; with the defaults put back, both run again.
func TestRoleDefaultsOfAnotherDatabaseAreRefused(t *testing.T) {
	p, admin := defaultsPool(t, tenantdb.Session{})
	want := answer(p.QueryRow(as("a"), defaultsProbe))
	if want != "off \"$user\", public" {
		t.Fatalf("a's defaults: %q", want)
	}
	if got := answer(p.QueryRow(as("c"), defaultsProbe)); got != want {
		t.Fatalf("c's defaults: %q, want %q", got, want)
	}
	for _, tenant := range []string{"c", "d"} {
		db, _ := defaultsDB(tenant)
		for _, set := range []string{"default_transaction_read_only = on", "search_path = nowhere"} {
			if _, err := p.Exec(as("a"), "alter role current_user in database "+db+" set "+set); err != nil {
				t.Fatalf("a could not set the login role's defaults in %s (the test would prove nothing): %v", db, err)
			}
		}
	}
	p.Reset() // c's connection is opened again
	for _, tenant := range []string{"d", "c"} {
		db, _ := defaultsDB(tenant)
		var got string
		err := p.QueryRow(as(tenant), defaultsProbe).Scan(&got)
		if !errors.Is(err, tenantdb.ErrRoleDefaultsChanged) {
			t.Fatalf("%s, after a set the login role's defaults in %s: %q, %v; want ErrRoleDefaultsChanged", tenant, db, got, err)
		}
		t.Logf("%s: %v", tenant, err)
		for _, name := range []string{db, "default_transaction_read_only=on", "search_path=nowhere"} {
			if !strings.Contains(err.Error(), name) {
				t.Fatalf("%s's error does not name %s: %v", tenant, name, err)
			}
		}
	}
	assertNothingHeld(t, p)
	// Only the login role's own defaults in those two databases changed.
	if got := answer(p.QueryRow(as("a"), defaultsProbe)); got != want {
		t.Fatalf("a's defaults: %q, want %q", got, want)
	}
	for _, tenant := range []string{"c", "d"} {
		db, _ := defaultsDB(tenant)
		if _, err := admin.Exec(context.Background(), "alter role "+defaultsRole+" in database "+db+" reset all"); err != nil {
			t.Fatal(err)
		}
		if got := answer(p.QueryRow(as(tenant), defaultsProbe)); got != want {
			t.Fatalf("with the defaults put back, %s's are %q, want %q", tenant, got, want)
		}
	}
	assertNothingHeld(t, p)
}

// TestRoleDefaultsUnderSessionRole: with Session.Role, CURRENT_USER is the
// tenant's role, so a's ALTER ROLE CURRENT_USER changes only that role's
// defaults, which no session of the login role takes: d runs with the
// login role's own. Session.Role does not stop SQL that runs RESET ROLE
// first, which is the login role again: the check still refuses d then.
func TestRoleDefaultsUnderSessionRole(t *testing.T) {
	role := func(tenant string) string { return "tenantdb_defects_role_" + tenant }
	var setup strings.Builder
	for _, tenant := range []string{"a", "c", "d"} {
		fmt.Fprintf(&setup, `do $$ begin
	if not exists (select from pg_roles where rolname = '%[1]s') then create role %[1]s nologin; end if;
end $$;
grant %[1]s to %[2]s;
`, role(tenant), defaultsRole)
	}
	dDB, _ := defaultsDB("d")
	setup.WriteString("alter role " + role("a") + " in database " + dDB + " reset all;\n")
	p, admin := defaultsPool(t, tenantdb.Session{Role: role})
	if _, err := admin.Exec(context.Background(), setup.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "alter role "+role("a")+" in database "+dDB+" reset all")
	})
	const probe = defaultsProbe + " || ' ' || current_user"
	want := func(tenant string) string { return "off \"$user\", public " + role(tenant) }
	if got := answer(p.QueryRow(as("a"), probe)); got != want("a") {
		t.Fatalf("a: %q, want %q", got, want("a"))
	}
	for _, set := range []string{"default_transaction_read_only = on", "search_path = nowhere"} {
		if _, err := p.Exec(as("a"), "alter role current_user in database "+dDB+" set "+set); err != nil {
			t.Fatalf("a could not set its own role's defaults: %v", err)
		}
	}
	if got := answer(p.QueryRow(as("d"), probe)); got != want("d") {
		t.Fatalf("d, after a set its own role's defaults in d's database: %q, want %q", got, want("d"))
	}
	// The limit: RESET ROLE, and a's SQL is the login role's again.
	if _, err := p.Exec(as("a"), "reset role; alter role current_user in database "+dDB+" set search_path = nowhere"); err != nil {
		t.Fatalf("a's RESET ROLE and ALTER ROLE: %v", err)
	}
	p.Reset()
	if err := p.QueryRow(as("d"), probe).Scan(new(string)); !errors.Is(err, tenantdb.ErrRoleDefaultsChanged) {
		t.Fatalf("d after a's RESET ROLE and ALTER ROLE: %v, want ErrRoleDefaultsChanged", err)
	}
	assertNothingHeld(t, p)
}
