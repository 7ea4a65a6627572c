package tenantdb_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/internal/pgtest"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// tenantRole is the role of tenant id in the tests of Session.Role.
func tenantRole(id string) string { return "tenantdb_role_" + id }

// setupRoles creates the roles of tenants a and b, both granted to rlsRole,
// and role_docs, whose policy shows each role its own rows (a 2, b 1) and
// which only those roles may read: a statement that runs as the login role
// fails. It returns a DSN for rlsRole.
func setupRoles(t *testing.T) string {
	t.Helper()
	var roles strings.Builder
	for _, id := range []string{"a", "b"} {
		fmt.Fprintf(&roles, `do $$ begin
	if not exists (select from pg_roles where rolname = '%[1]s') then create role %[1]s nologin; end if;
end $$;
grant %[1]s to %[2]s;
`, tenantRole(id), rlsRole)
	}
	return pgtest.AppRole(t, sharedPG.DSN, rlsRole, roles.String()+`
drop table if exists role_docs;
create table role_docs (owner text not null default current_user, body text not null);
alter table role_docs enable row level security;
alter table role_docs force row level security;
create policy by_role on role_docs using (owner = current_user);
grant select on role_docs to `+tenantRole("a")+`, `+tenantRole("b")+`;
insert into role_docs values ('`+tenantRole("a")+`', 'a1'), ('`+tenantRole("a")+`', 'a2'), ('`+tenantRole("b")+`', 'b1');
`)
}

// roleProbe shows the role a statement ran as and how many role_docs rows
// it saw (a: 2, b: 1).
const roleProbe = "select current_user::text, (select count(*) from role_docs)"

var roleRows = map[string]int64{"a": 2, "b": 1}

// TestSessionRole: with Session.Role, every statement of a tenant runs as
// the tenant's role and never as another's, in both scopes, on direct
// connections and through PgBouncer (transaction pooling for
// ScopeTransaction, session pooling for ScopeSession), with tenants a and b
// concurrent on fewer connections than goroutines. Work without a tenant
// runs as the login role.
func TestSessionRole(t *testing.T) {
	dsn := setupRoles(t)
	cases := []struct {
		name    string
		scope   tenantdb.Scope
		bouncer string // PgBouncer's pool mode, or "" for direct connections
	}{
		{"ScopeSession direct", tenantdb.ScopeSession, ""},
		{"ScopeTransaction direct", tenantdb.ScopeTransaction, ""},
		{"ScopeTransaction behind transaction pooling", tenantdb.ScopeTransaction, tenantdbtest.PoolModeTransaction},
		{"ScopeSession behind session pooling", tenantdb.ScopeSession, tenantdbtest.PoolModeSession},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			connect := dsn + "&default_query_exec_mode=exec"
			if c.bouncer != "" {
				size := 2
				if c.bouncer == tenantdbtest.PoolModeSession {
					size = 4 // one server connection per client connection
				}
				b := tenantdbtest.StartPgBouncer(t, sharedPG, tenantdbtest.WithPoolMode(c.bouncer),
					tenantdbtest.WithPoolSize(size), tenantdbtest.WithPgBouncerUser(rlsRole, "app"))
				connect = b.DSNFor(rlsRole, "app") + "&default_query_exec_mode=exec"
			}
			p, err := tenantdb.New(context.Background(), pgxConfig(t, &tenantdbtest.Postgres{DSN: connect}, 4), tenantdb.Config{
				Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 2, MaxWaiting: 10, MaxWait: time.Minute}},
				Session: tenantdb.Session{Role: tenantRole, Scope: c.scope},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			tally := &proxyTally{wrong: map[string]int{}}
			var wg sync.WaitGroup
			for _, tenant := range []string{"a", "b", "a", "b", "a", "b"} {
				wg.Go(func() {
					for range 10 {
						roleStatements(tenantdb.WithTenant(t.Context(), tenant), p, tenant, tally)
					}
				})
			}
			wg.Wait()
			t.Logf("%d of %d statements ran as another role or saw others' rows: %v", tally.leaks(), tally.statements, tally.wrong)
			if len(tally.failed) > 0 {
				t.Errorf("unexpected errors:\n%s", strings.Join(tally.failed, "\n"))
			}
			if n := tally.leaks(); n > 0 {
				t.Fatalf("%d of %d statements ran as another role or saw others' rows: %v", n, tally.statements, tally.wrong)
			}
			assertNothingHeld(t, p)
			if c.scope == tenantdb.ScopeSession {
				// Idle connections taken on no tenant's behalf are the
				// login role's.
				for _, conn := range p.AcquireAllIdle(t.Context()) {
					var role string
					err := conn.Conn().QueryRow(t.Context(), "select current_user::text").Scan(&role)
					conn.Release()
					if err != nil || role != rlsRole {
						t.Errorf("a connection acquired without a tenant runs as %q (%v), want the login role %s", role, err, rlsRole)
					}
				}
			}
		})
	}
}

// roleStatements runs the probe as tenant through each way the Pool runs a
// statement.
func roleStatements(ctx context.Context, p *tenantdb.Pool, tenant string, tally *proxyTally) {
	probe := func(what string, row pgx.Row) {
		var role string
		var n int64
		if err := row.Scan(&role, &n); err != nil {
			tally.fail(what+" as "+tenant, err)
			return
		}
		tally.saw(tenant, fmt.Sprintf("%s ran as %s seeing %d rows", what, role, n), role == tenantRole(tenant) && n == roleRows[tenant])
	}
	probe("QueryRow", p.QueryRow(ctx, roleProbe))
	if tag, err := p.Exec(ctx, "select from role_docs where $1::int >= 0", 1); err != nil {
		tally.fail("Exec as "+tenant, err)
	} else {
		tally.saw(tenant, fmt.Sprintf("Exec saw %d rows", tag.RowsAffected()), tag.RowsAffected() == roleRows[tenant])
	}
	b := &pgx.Batch{}
	b.Queue(roleProbe)
	br := p.SendBatch(ctx, b)
	probe("SendBatch", br.QueryRow())
	if err := br.Close(); err != nil {
		tally.fail("SendBatch as "+tenant, err)
	}
	if tx, err := p.Begin(ctx); err != nil {
		tally.fail("Begin as "+tenant, err)
	} else {
		probe("Begin", tx.QueryRow(ctx, roleProbe))
		if err := tx.Commit(ctx); err != nil {
			tally.fail("Commit as "+tenant, err)
		}
	}
	if c, err := p.Acquire(ctx); err != nil {
		tally.fail("Acquire as "+tenant, err)
	} else {
		probe("Conn.QueryRow", c.QueryRow(ctx, roleProbe))
		c.Release()
	}
}

// TestSessionRoleNames: a role name PostgreSQL would refuse, truncate or
// read as the login role ("none"), and a panicking Role, fail the call in
// both scopes, hold nothing, and keep the healthy connection they never
// touched.
func TestSessionRoleNames(t *testing.T) {
	dsn := setupRoles(t)
	for _, scope := range []tenantdb.Scope{tenantdb.ScopeSession, tenantdb.ScopeTransaction} {
		pcfg := pgxConfig(t, &tenantdbtest.Postgres{DSN: dsn + "&default_query_exec_mode=exec"}, 1)
		p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
			Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}},
			Session: tenantdb.Session{Scope: scope, Role: func(id string) string {
				switch id {
				case "long":
					return "tenantdb_role_" + strings.Repeat("x", 50) // 64 bytes
				case "none":
					return "none"
				case "empty":
					return ""
				case "nul":
					return "tenantdb_role_a\x00"
				case "panics":
					panic("no role for this tenant")
				}
				return tenantRole(id)
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var pid, again int
		if err := p.QueryRow(as("a"), "select pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		for _, tenant := range []string{"long", "none", "empty", "nul", "panics"} {
			var role string
			err := p.QueryRow(as(tenant), "select current_user::text").Scan(&role)
			if err == nil {
				t.Fatalf("scope %d, %s: the call ran as %s instead of failing", scope, tenant, role)
			}
			if !strings.Contains(err.Error(), "Session.Role") {
				t.Errorf("scope %d, %s: err = %v, want one that names Session.Role", scope, tenant, err)
			}
			assertNothingHeld(t, p)
		}
		if err := p.QueryRow(as("a"), "select pg_backend_pid()").Scan(&again); err != nil {
			t.Fatal(err)
		}
		if again != pid {
			t.Errorf("scope %d: the failed setups replaced the healthy connection (backend %d, then %d)", scope, pid, again)
		}
	}
}
