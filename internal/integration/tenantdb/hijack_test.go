package tenantdb_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// TestHandoverCheckCannotBeShadowed: the reset runs in the previous
// holder's session. Tenant a prepares its own statement under the name pgx
// gave b's query (as in TestHandoverRefusesHijackedStatements) and then
// tries to hide it from whatever the reset reads: with a temporary view
// named pg_prepared_statements, which pg_temp puts in front of pg_catalog's,
// or with a search_path that puts its own "=" operator in front of
// pg_catalog's. b's next request must still run b's query.
func TestHandoverCheckCannotBeShadowed(t *testing.T) {
	setupSessionState(t)
	admin, err := pgx.Connect(t.Context(), sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	// A schema per tenant, in which the tenant may create objects, as
	// tenants that run their own SQL often may.
	if _, err := admin.Exec(t.Context(), "grant create on schema tenant_a to "+rlsRole); err != nil {
		t.Fatal(err)
	}
	const q = "select 'b asked for ' || $1::text"
	sum := sha256.Sum256([]byte(q))
	name := "stmtcache_" + hex.EncodeToString(sum[:24])
	// pgx's statement stays across the reset: a drops it and puts its own
	// under the name.
	hijack := `deallocate "` + name + `"; prepare "` + name + `" (text) as select 'a took over: ' || $1::text;`
	covers := map[string]string{
		"temporary view": `create temp view pg_prepared_statements as
			select name, false as from_sql from pg_catalog.pg_prepared_statements`,
		"operator on the search_path": `create function tenant_a.always(bigint, integer) returns boolean
				language sql immutable as 'select true';
			create operator tenant_a.= (leftarg = bigint, rightarg = integer, function = tenant_a.always);
			set search_path = tenant_a, pg_catalog`,
	}
	for cover, sql := range covers {
		for _, withSession := range []bool{false, true} {
			if _, err := admin.Exec(t.Context(), "drop operator if exists tenant_a.= (bigint, integer); drop function if exists tenant_a.always"); err != nil {
				t.Fatal(err)
			}
			p := newStatePool(t, withSession, false)
			if got := answer(p.QueryRow(as("b"), q, "x")); got != "b asked for x" {
				t.Fatalf("b's first request answered %q", got)
			}
			var prepared bool
			err := p.QueryRow(as("b"), "select exists (select from pg_prepared_statements where name = $1 and not from_sql)", name).Scan(&prepared)
			if err != nil || !prepared {
				t.Fatalf("pgx did not prepare %s for b's query (%v): the test would prove nothing", name, err)
			}
			if _, err := p.Exec(as("a"), hijack+sql); err != nil {
				t.Fatalf("%s: %v", cover, err)
			}
			if got := answer(p.QueryRow(as("b"), q, "x")); got != "b asked for x" {
				t.Errorf("%s, Session %v: after a replaced pgx's statement, b's request answered %q", cover, withSession, got)
			}
			if got := answer(p.QueryRow(as("b"), q, "y")); got != "b asked for y" {
				t.Errorf("%s, Session %v: b's next request answered %q", cover, withSession, got)
			}
			assertNothingHeld(t, p)
		}
	}
}

// TestScopeTransactionDefaultPathCannotBeShadowed: behind PgBouncer in
// pool_mode=transaction (one server connection), a new connection of the
// Pool reads the login role's default search_path, to pin it for tenants
// without a SearchPath, on a server session that tenant a changed: a
// search_path that puts a's schema, with an "=" operator that is always
// true, before pg_catalog, and a temporary pin_docs of a's rows. Tenant b's
// reads through that connection must still find the real pin_docs, under
// its policy: b's rows only.
func TestScopeTransactionDefaultPathCannotBeShadowed(t *testing.T) {
	setupPins(t)
	admin, err := pgx.Connect(t.Context(), sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(t.Context(), "grant create on schema pin_private to "+rlsRole); err != nil {
		t.Fatal(err)
	}
	bouncer := tenantdbtest.StartPgBouncer(t, sharedPG,
		tenantdbtest.WithPoolMode(tenantdbtest.PoolModeTransaction),
		tenantdbtest.WithPoolSize(1),
		tenantdbtest.WithPgBouncerUser(rlsRole, "app"))
	bdsn := bouncer.DSNFor(rlsRole, "app") + "&default_query_exec_mode=exec"
	newPool := func() *tenantdb.Pool {
		p, err := tenantdb.New(context.Background(), pgxConfig(t, &tenantdbtest.Postgres{DSN: bdsn}, 1), tenantdb.Config{
			Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 1}},
			Session: tenantdb.Session{TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	read := func(p *tenantdb.Pool) string {
		var tenants, role string
		if err := p.QueryRow(as("b"), pinRead).Scan(&tenants, &role); err != nil {
			return "error: " + err.Error()
		}
		return tenants
	}
	if got := read(newPool()); got != "b" {
		t.Fatalf("b read %q before a's turn, want %q", got, "b")
	}
	_, err = newPool().Exec(as("a"), `create function pin_private.always(text, text) returns boolean
			language sql immutable as 'select true';
		create operator pin_private.= (leftarg = text, rightarg = text, function = pin_private.always);
		create temp table pin_docs as select 'planted by a' as tenant, 'x' as body;
		select pg_catalog.set_config('search_path', 'pin_private, pg_catalog', false)`)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(newPool()); got != "b" {
		t.Errorf("after a's turn, b's read on a new connection saw %q, want %q", got, "b")
	}
}
