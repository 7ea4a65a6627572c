package tenantdb_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestHandoverCheckCannotBeShadowed: the reset checks pgx's prepared
// statements by reading pg_prepared_statements with the previous holder's
// session still in place. Tenant a replaces the statement pgx prepared for
// b's query (as in TestHandoverRefusesHijackedStatements) and then hides
// that from the check: with a temporary view of that name, which pg_temp
// puts in front of pg_catalog's, or with a search_path that puts its own
// "=" operator in front of pg_catalog's. b's next request must still run
// b's query.
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
