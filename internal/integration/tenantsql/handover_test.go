package tenantsql_test

import (
	"testing"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestFailedResetReachesNoStatement: tenant a's PREPARE makes the reset of
// the next change of tenant fail, and the statement it travelled with is
// skipped by the server. tenantsql does not send that statement again, so
// b's statements after it on the same sql.Conn must not run in a's session
// (a's app.tenant_id, with ScopeSession): each either fails or sees b's rows
// only. Outside an sql.Conn, database/sql sends the statement again on
// another connection, so b's call succeeds.
func TestFailedResetReachesNoStatement(t *testing.T) {
	dsn := setupRLS(t)
	p := newPool(t, dsn, 1, tenantdb.Plan{MaxConns: 1}, rlsSession)
	db := openDB(t, p)
	const read = "select string_agg(body, ',' order by body) from docs where id > $1"
	var bodies string
	if err := db.QueryRowContext(as("b"), read, 0).Scan(&bodies); err != nil || bodies != "b1" {
		t.Fatalf("b's first statement: %q, %v", bodies, err)
	}
	// pgx now keeps a prepared statement for read: the reset checks them.
	if _, err := db.ExecContext(as("a"), "prepare tenantsql_a_stmt as select 1"); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(as("b"))
	if err != nil {
		t.Fatal(err)
	}
	ok := 0
	for i := range 3 {
		var bodies string
		err := conn.QueryRowContext(as("b"), read, 0).Scan(&bodies)
		switch {
		case err != nil:
			t.Logf("b's statement %d failed: %v", i, err)
		case bodies != "b1":
			t.Errorf("b's statement %d on its sql.Conn saw %q, want b's rows only (%q)", i, bodies, "b1")
		default:
			ok++
		}
	}
	conn.Close()
	if err := db.QueryRowContext(as("b"), read, 0).Scan(&bodies); err != nil || bodies != "b1" {
		t.Errorf("b's next statement on a new sql.Conn: %q, %v; want %q", bodies, err, "b1")
	}
	// Outside an sql.Conn, database/sql sends the statement again on
	// another connection: b does not see a's PREPARE at all.
	if _, err := db.ExecContext(as("a"), "prepare tenantsql_a_stmt as select 1"); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(as("b"), read, 0).Scan(&bodies); err != nil || bodies != "b1" {
		t.Errorf("b's statement after a's second PREPARE: %q, %v; want %q", bodies, err, "b1")
	}
	assertReleased(t, p, "b")
}

// TestUndoneResetReachesNoStatement: the reset of a change of tenant shares
// its transaction with the statement it travels with, so when that
// statement fails the reset is rolled back with it and the session is
// tenant a's again. b's next statement on the same sql.Conn must not run
// in it: it either fails or sees b's rows only.
func TestUndoneResetReachesNoStatement(t *testing.T) {
	dsn := setupRLS(t)
	p := newPool(t, dsn, 1, tenantdb.Plan{MaxConns: 1}, rlsSession)
	db := openDB(t, p)
	// b's statement is in pgx's cache, so that it goes in one round trip
	// with the reset, not after a Describe of its own.
	var n int
	if err := db.QueryRowContext(as("b"), "select 1 / $1::int", 1).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(as("a"), "select 1"); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(as("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.QueryRowContext(as("b"), "select 1 / $1::int", 0).Scan(&n); err == nil {
		t.Fatal("b's division by zero succeeded")
	}
	const read = "select string_agg(body, ',' order by body) from docs where id > $1"
	var bodies string
	err = conn.QueryRowContext(as("b"), read, 0).Scan(&bodies)
	if err == nil && bodies != "b1" {
		t.Errorf("after its failed statement, b's next statement on its sql.Conn saw %q, want b's rows only (%q)", bodies, "b1")
	}
	t.Logf("b's next statement: %q, %v", bodies, err)
	conn.Close()
	if err := db.QueryRowContext(as("b"), read, 0).Scan(&bodies); err != nil || bodies != "b1" {
		t.Errorf("b's statement on a new connection: %q, %v; want %q", bodies, err, "b1")
	}
	assertReleased(t, p, "b")
}
