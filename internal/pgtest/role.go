// Package pgtest prepares the shared PostgreSQL of a package's tests.
package pgtest

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
)

// AppRole creates, as the superuser of superDSN, the login role role with
// password "app" and without SUPERUSER or BYPASSRLS, so that row-level
// security policies apply to it, unless it exists; then it runs setup (SQL
// that may name the role) as the superuser, and returns a DSN that connects
// as role.
func AppRole(t testing.TB, superDSN, role, setup string) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, superDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `
do $$ begin
	if not exists (select from pg_roles where rolname = '`+role+`') then
		create role `+role+` login password 'app' nosuperuser nobypassrls;
	end if;
end $$;
`+setup)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(superDSN)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "app")
	return u.String()
}
