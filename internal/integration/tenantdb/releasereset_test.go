package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// The reset at release (issue 50) and the holes of issue 51 that lived in
// the reset that rode inside pgx's socket.

// TestChannelBindingThroughPool: with channel_binding=require, tenantdb's
// pool connects over TLS as plain pgxpool does: tenantdb no longer wraps
// pgx's socket, which hid the *tls.Conn that channel binding needs.
func TestChannelBindingThroughPool(t *testing.T) {
	pg := tenantdbtest.StartPostgres(t,
		tenantdbtest.WithSetting("ssl", "on"),
		tenantdbtest.WithSetting("ssl_cert_file", "/etc/ssl/certs/ssl-cert-snakeoil.pem"),
		tenantdbtest.WithSetting("ssl_key_file", "/etc/ssl/private/ssl-cert-snakeoil.key"))
	u, err := url.Parse(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslmode", "require")
	q.Set("channel_binding", "require")
	u.RawQuery = q.Encode()
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 2
	for _, s := range []tenantdb.Session{{}, {TenantSetting: "app.tenant_id"}, {TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction}} {
		cfg := pcfg.Copy()
		if s.Scope == tenantdb.ScopeTransaction {
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		}
		p, err := tenantdb.New(context.Background(), cfg, tenantdb.Config{
			Plans: map[string]tenantdb.Plan{"p": {MaxConns: 2}}, DefaultPlan: "p", Session: s,
		})
		if err != nil {
			t.Fatal(err)
		}
		var ssl bool
		err = p.QueryRow(as("a"), "select ssl from pg_catalog.pg_stat_ssl where pid = pg_catalog.pg_backend_pid()").Scan(&ssl)
		p.Close()
		if err != nil {
			t.Fatalf("Session %+v: channel_binding=require through tenantdb.New: %v", s, err)
		}
		if !ssl {
			t.Fatalf("Session %+v: the connection is not over TLS", s)
		}
	}
}

// leaveDirty leaves, as tenant, what makes a reset slow or fail: a 1 ms
// statement_timeout, a setting, and temporary tables.
func leaveDirty(t *testing.T, p *tenantdb.Pool, tenant string, tables int) {
	t.Helper()
	c, err := p.Acquire(as(tenant))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	_, err = c.Exec(as(tenant), fmt.Sprintf(`set app.leftover = %q; do $$ begin
		for i in 1..%d loop execute format('create temp table t%%s (x int)', i); end loop; end $$`, tenant, tables))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(as(tenant), "set statement_timeout = '1ms'"); err != nil {
		t.Fatal(err)
	}
}

// TestTwoSyncWriteRunsInAResetSession: a pipeline of two Syncs sent through
// Pool.Pgxpool after a tenant left a session that makes a reset fail runs
// both parts in a session with the defaults: the reset happens at release,
// never inside pgx's stream.
func TestTwoSyncWriteRunsInAResetSession(t *testing.T) {
	p := newPool(t, sharedPG, 1, tenantdb.Config{Plans: map[string]tenantdb.Plan{"p": {MaxConns: 1, MaxWaiting: 5, MaxWait: time.Minute}}, DefaultPlan: "p"})
	for i := range 5 {
		leaveDirty(t, p, "a", 300)
		c, err := p.Pgxpool().Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		pipe := c.Conn().PgConn().StartPipeline(context.Background())
		const q = "select coalesce(pg_catalog.current_setting('app.leftover', true), ''), pg_catalog.current_setting('statement_timeout')"
		for range 2 {
			pipe.SendQueryParams(q, nil, nil, nil, nil)
			if err := pipe.Sync(); err != nil {
				t.Fatal(err)
			}
		}
		for seg := range 2 {
			res, err := pipe.GetResults()
			if err != nil {
				t.Fatalf("round %d segment %d: %v", i, seg, err)
			}
			rr := res.(*pgconn.ResultReader).Read()
			if rr.Err != nil {
				t.Fatalf("round %d segment %d: %v", i, seg, rr.Err)
			}
			if left, timeout := string(rr.Rows[0][0]), string(rr.Rows[0][1]); left != "" || timeout != "0" {
				t.Fatalf("round %d segment %d ran in the previous holder's session: app.leftover %q, statement_timeout %q", i, seg, left, timeout)
			}
			if _, err := pipe.GetResults(); err != nil { // the Sync
				t.Fatal(err)
			}
		}
		if err := pipe.Close(); err != nil {
			t.Fatal(err)
		}
		c.Release()
	}
	assertNothingHeld(t, p)
}

// TestBeginTxWithIsolationAfterChangeOfTenant: a transaction with an
// isolation level begins on a connection that changes tenant, with a Role
// and a SearchPath, in both cached and exec modes.
func TestBeginTxWithIsolationAfterChangeOfTenant(t *testing.T) {
	admin := rawPool(t, sharedPG, 1)
	for _, tenant := range []string{"iso_a", "iso_b"} {
		if _, err := admin.Exec(context.Background(), fmt.Sprintf(`do $$ begin
			if not exists (select from pg_roles where rolname = 'tenant_%[1]s') then create role tenant_%[1]s; end if; end $$;
			grant tenant_%[1]s to current_user; create schema if not exists %[1]s`, tenant)); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		pcfg := pgxConfig(t, sharedPG, 1)
		pcfg.ConnConfig.DefaultQueryExecMode = mode
		p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
			Plans: map[string]tenantdb.Plan{"p": {MaxConns: 1, MaxWaiting: 5, MaxWait: time.Minute}}, DefaultPlan: "p",
			Session: tenantdb.Session{
				Role:       func(id string) string { return "tenant_" + id },
				SearchPath: func(id string) []string { return []string{id} },
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			tenant := []string{"iso_a", "iso_b"}[i%2]
			tx, err := p.BeginTx(as(tenant), pgx.TxOptions{IsoLevel: pgx.Serializable})
			if err != nil {
				p.Close()
				t.Fatalf("mode %v, try %d: BeginTx(serializable) after a change of tenant: %v", mode, i, err)
			}
			var iso, role string
			err = tx.QueryRow(as(tenant), "select pg_catalog.current_setting('transaction_isolation'), current_user::text").Scan(&iso, &role)
			_ = tx.Rollback(as(tenant))
			if err != nil || iso != "serializable" || role != "tenant_"+tenant {
				p.Close()
				t.Fatalf("mode %v, try %d: isolation %q role %q err %v", mode, i, iso, role, err)
			}
		}
		p.Close()
	}
}

// TestRetryNeverRunsInTheTemplateDatabase: with a database per tenant, a
// tenant that ends its own backend leaves nothing that sends the next
// call, or any call, to another database (issue 51, item 1).
func TestRetryNeverRunsInTheTemplateDatabase(t *testing.T) {
	admin := rawPool(t, sharedPG, 1)
	for _, db := range []string{"rr_a", "rr_b"} {
		_, _ = admin.Exec(context.Background(), "create database "+db)
	}
	p := newPool(t, sharedPG, 2, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"p": {MaxConns: 2, MaxWaiting: 5, MaxWait: time.Minute}}, DefaultPlan: "p",
		Session:  tenantdb.Session{TenantSetting: "app.tenant_id"},
		Database: func(id string) (string, error) { return "rr_" + id, nil },
	})
	for i := range 8 {
		for _, tenant := range []string{"a", "b"} {
			// The tenant ends its own backend: its call fails, and so may the
			// next one on a connection the server closed; none runs elsewhere.
			_, _ = p.Exec(as(tenant), "select pg_catalog.pg_terminate_backend(pg_catalog.pg_backend_pid())")
			var db string
			ops := []func() error{
				func() error { return p.QueryRow(as(tenant), "select current_database()").Scan(&db) },
				func() error {
					tx, err := p.Begin(as(tenant))
					if err != nil {
						return err
					}
					defer tx.Rollback(as(tenant))
					return tx.QueryRow(as(tenant), "select current_database()").Scan(&db)
				},
				func() error {
					c, err := p.Acquire(as(tenant))
					if err != nil {
						return err
					}
					defer c.Release()
					return c.QueryRow(as(tenant), "select current_database()").Scan(&db)
				},
			}
			db = ""
			if err := ops[i%len(ops)](); err == nil && db != "rr_"+tenant {
				t.Fatalf("round %d: tenant %s's statement ran in database %q", i, tenant, db)
			}
		}
	}
	assertNothingHeld(t, p)
}

// TestBadRoleClosesNoSharedConnection: a tenant whose Session.Role does not
// exist fails its own call; the other tenants' warm connections stay open
// (issue 51, item 4).
func TestBadRoleClosesNoSharedConnection(t *testing.T) {
	admin := rawPool(t, sharedPG, 1)
	if _, err := admin.Exec(context.Background(), `do $$ begin
		if not exists (select from pg_roles where rolname = 'tenant_good') then create role tenant_good; end if; end $$;
		grant tenant_good to current_user`); err != nil {
		t.Fatal(err)
	}
	p := newPool(t, sharedPG, 4, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"p": {MaxConns: 4}}, DefaultPlan: "p",
		Session: tenantdb.Session{Role: func(id string) string { return "tenant_" + id }},
	})
	// Warm four connections, the last holder the good tenant.
	var conns []tenantdb.Conn
	for range 4 {
		c, err := p.Acquire(as("good"))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	pids := map[uint32]bool{}
	for _, c := range conns {
		pids[c.Conn().PgConn().PID()] = true
		c.Release()
	}
	eventually(t, "the four connections are back", func() bool { return p.Stat().IdleConns() == 4 })
	if _, err := p.Exec(as("missing_role"), "select 1"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a tenant with a role that does not exist: got %v, want the server's error", err)
	}
	for range 4 {
		if _, err := p.Exec(as("good"), "select 1"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the connections are back", func() bool { return p.Stat().AcquiredConns() == 0 })
	var open int
	if err := admin.QueryRow(context.Background(), "select count(*) from pg_stat_activity where pid = any($1)",
		keys(pids)).Scan(&open); err != nil {
		t.Fatal(err)
	}
	if open != 4 || p.Stat().TotalConns() != 4 {
		t.Fatalf("after the bad role's call %d of the 4 warm connections are open, the pool has %d", open, p.Stat().TotalConns())
	}
}

// TestBadRoleOnADirtyConnectionClosesNothing: a connection left dirty for
// its next holder (here by a streak of one tenant) is reset in the bad
// role's prepare, in the round trip whose last statements set the role;
// the role's failure is the tenant's own and must not count as a failed
// reset, which would close the connection (and the next, and the next).
func TestBadRoleOnADirtyConnectionClosesNothing(t *testing.T) {
	admin := rawPool(t, sharedPG, 1)
	if _, err := admin.Exec(context.Background(), `do $$ begin
		if not exists (select from pg_roles where rolname = 'tenant_good') then create role tenant_good; end if; end $$;
		grant tenant_good to current_user`); err != nil {
		t.Fatal(err)
	}
	p := newPool(t, sharedPG, 1, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"p": {MaxConns: 1, MaxWaiting: 5, MaxWait: time.Minute}}, DefaultPlan: "p",
		Session: tenantdb.Session{Role: func(id string) string { return "tenant_" + id }},
	})
	var pid uint32
	for range 6 {
		if err := p.QueryRow(as("good"), "select pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the connection is back", func() bool { return p.Stat().IdleConns() == 1 })
	}
	made := p.Stat().NewConnsCount()
	if _, err := p.Exec(as("missing_role"), "select 1"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a tenant with a role that does not exist: got %v, want the server's error", err)
	}
	var again uint32
	if err := p.QueryRow(as("good"), "select pg_backend_pid()").Scan(&again); err != nil {
		t.Fatal(err)
	}
	if n := p.Stat().NewConnsCount() - made; n != 0 || again != pid {
		t.Fatalf("the bad role's call on the dirty connection: %d connections made after it, backend %d then %d", n, pid, again)
	}
}

func keys(m map[uint32]bool) []uint32 {
	var out []uint32
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestLeftoversDoNotStallTheNextTenant: a holder that leaves a temporary
// table whose reset waits on a lock held elsewhere stalls only its own
// connection's reset, at release: the next tenant's call runs at once on
// another connection, within a deadline far shorter than the stall (issue
// 51, item 5). And a context that ends while a connection is readied
// reports the context's error.
func TestLeftoversDoNotStallTheNextTenant(t *testing.T) {
	admin := rawPool(t, sharedPG, 2)
	p := newPool(t, sharedPG, 2, tenantdb.Config{Plans: map[string]tenantdb.Plan{"p": {MaxConns: 2}}, DefaultPlan: "p",
		Session: tenantdb.Session{TenantSetting: "app.tenant_id"}})
	ctx := context.Background()
	if _, err := admin.Exec(ctx, "create schema if not exists stall"); err != nil {
		t.Fatal(err)
	}
	// a: a temporary table and a function in a permanent schema typed on
	// it; DISCARD TEMP drops the function too, and waits for its lock.
	c, err := p.Acquire(as("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(as("a"), `create temp table leftover (x int);
		create or replace function stall.f(leftover) returns int language sql as 'select 1'`); err != nil {
		c.Release()
		t.Fatal(err)
	}
	var temp string
	if err := c.QueryRow(as("a"), "select nspname::text from pg_catalog.pg_namespace where oid = pg_catalog.pg_my_temp_schema()").Scan(&temp); err != nil {
		c.Release()
		t.Fatal(err)
	}
	// Another session holds a lock on the function that dropping it needs.
	lock, err := admin.Begin(ctx)
	if err != nil {
		c.Release()
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, "comment on function stall.f("+temp+".leftover) is 'held'"); err != nil {
		c.Release()
		t.Fatal(err)
	}
	c.Release() // a's reset at release now waits
	deadline, cancel := context.WithTimeout(as("b"), 3*time.Second)
	defer cancel()
	var one int
	if err := p.QueryRow(deadline, "select 1").Scan(&one); err != nil {
		t.Fatalf("b's call while a's leftovers stall a's reset: %v", err)
	}
	_ = lock.Rollback(ctx)
	eventually(t, "a's connection is reset or destroyed", func() bool { return p.Stat().AcquiredConns() == 0 })

	// A context that ends while the connection is readied: the error
	// matches the context's.
	for i := range 16 {
		ctx, cancel := context.WithTimeout(as(fmt.Sprintf("t%d", i%3)), time.Duration(i)*100*time.Microsecond)
		err := p.QueryRow(ctx, "select 1").Scan(&one)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("try %d: a call whose context ended returned %v, which matches neither context error", i, err)
		}
	}
	assertNothingHeld(t, p)
}

// TestDeallocateAllKeepsOthersStatements: a tenant's DEALLOCATE ALL drops
// pgx's statements on the server; the next tenant's cached statements work
// (issue 51, item 6).
func TestDeallocateAllKeepsOthersStatements(t *testing.T) {
	p := newPool(t, sharedPG, 1, tenantdb.Config{Plans: map[string]tenantdb.Plan{"p": {MaxConns: 1, MaxWaiting: 5, MaxWait: time.Minute}}, DefaultPlan: "p"})
	queries := []string{"select $1::int + 1", "select $1::int + 2", "select $1::int + 3"}
	for _, q := range queries {
		var n int
		if err := p.QueryRow(as("b"), q, 1).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 3 {
		if _, err := p.Exec(as("a"), "deallocate all"); err != nil {
			t.Fatal(err)
		}
		for i, q := range queries {
			var n int
			if err := p.QueryRow(as("b"), q, 1).Scan(&n); err != nil || n != 2+i {
				t.Fatalf("round %d: b's cached statement %q after a's deallocate all: %d, %v", round, q, n, err)
			}
		}
	}
}

// TestChangeOfTenantKeepsPgxStatements: the release reset keeps the
// statements pgx prepared (DISCARD ALL less DEALLOCATE ALL), so another
// tenant's call reuses them: the server still holds the statement prepared
// for the first tenant, not a new one.
func TestChangeOfTenantKeepsPgxStatements(t *testing.T) {
	p := newPool(t, sharedPG, 1, tenantdb.Config{Plans: map[string]tenantdb.Plan{"p": {MaxConns: 1, MaxWaiting: 5, MaxWait: time.Minute}}, DefaultPlan: "p"})
	prepared := func(tenant string) (names []string, times []time.Time) {
		var n int
		if err := p.QueryRow(as(tenant), "select $1::int", 1).Scan(&n); err != nil {
			t.Fatal(err)
		}
		err := p.AcquireFunc(as(tenant), func(c tenantdb.Conn) error {
			rows, err := c.Conn().Query(context.Background(), "select name, prepare_time from pg_prepared_statements where statement = 'select $1::int'", pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				return err
			}
			for rows.Next() {
				var name string
				var at time.Time
				if err := rows.Scan(&name, &at); err != nil {
					return err
				}
				names, times = append(names, name), append(times, at)
			}
			return rows.Err()
		})
		if err != nil {
			t.Fatal(err)
		}
		return names, times
	}
	names, times := prepared("a")
	if len(names) != 1 {
		t.Fatalf("after tenant a's query the server holds %d statements of it (%v), want pgx's one", len(names), names)
	}
	for _, tenant := range []string{"b", "c", "a"} {
		gotNames, gotTimes := prepared(tenant)
		if len(gotNames) != 1 || gotNames[0] != names[0] || !gotTimes[0].Equal(times[0]) {
			t.Fatalf("after tenant %s's query the server holds %v prepared at %v, want %v prepared at %v (kept since tenant a)", tenant, gotNames, gotTimes, names, times)
		}
	}
}

// TestOneTenantsReleasesLeaveTheReset: while one tenant takes every
// connection, its releases leave the reset to the next holder (it would
// only get its own session back); another tenant's call still runs in a
// reset session, reset on its way in.
func TestOneTenantsReleasesLeaveTheReset(t *testing.T) {
	pcfg := pgxConfig(t, sharedPG, 1)
	writes, resets := new(atomic.Int64), new(atomic.Int64)
	countWrites(pcfg, writes, resets)
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:   map[string]tenantdb.Plan{"p": {MaxConns: 1, MaxWaiting: 5, MaxWait: time.Minute}},
		Session: tenantdb.Session{TenantSetting: "app.tenant_id"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	back := func() { eventually(t, "the connection is back", func() bool { return p.Stat().IdleConns() == 1 }) }
	for i := range 10 {
		if _, err := p.Exec(as("a"), "create temporary table if not exists a_leftover (secret text)"); err != nil {
			t.Fatal(err)
		}
		back()
		if i == 5 {
			resets.Store(0)
		}
	}
	if n := resets.Load(); n != 0 {
		t.Errorf("%d resets at release in tenant a's last four calls in a row, want none", n)
	}
	var leftover bool
	var setting string
	err = p.QueryRow(as("b"), "select to_regclass('pg_temp.a_leftover') is not null, current_setting('app.tenant_id')").Scan(&leftover, &setting)
	if err != nil {
		t.Fatal(err)
	}
	if leftover || setting != "b" {
		t.Fatalf("tenant b after tenant a's streak: a's temporary table there %v, app.tenant_id %q", leftover, setting)
	}
	back() // b's own release resets its session, in a goroutine: count it too
	if n := resets.Load(); n != 2 {
		t.Errorf("%d resets for tenant b's call after tenant a's streak, want 2 (a's session on b's way in, b's at its release)", n)
	}
	assertNothingHeld(t, p)
}

// TestQueryOptionsInBothScopes: pgx's options among the arguments work
// under ScopeTransaction as under ScopeSession (issue 51, item 8).
func TestQueryOptionsInBothScopes(t *testing.T) {
	for _, scope := range []tenantdb.Scope{tenantdb.ScopeSession, tenantdb.ScopeTransaction} {
		pcfg := pgxConfig(t, sharedPG, 2)
		pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
			Plans: map[string]tenantdb.Plan{"p": {MaxConns: 2}}, DefaultPlan: "p",
			Session: tenantdb.Session{TenantSetting: "app.tenant_id", Scope: scope},
		})
		if err != nil {
			t.Fatal(err)
		}
		check := func(what string, got string, err error) {
			t.Helper()
			if err != nil || got != "a:7" {
				p.Close()
				t.Fatalf("scope %v, %s: %q, %v", scope, what, got, err)
			}
		}
		const q = "select pg_catalog.current_setting('app.tenant_id') || ':' || $1::int"
		var s string
		_, err = p.Exec(as("a"), "select $1::int", pgx.QueryExecModeSimpleProtocol, 7)
		check("Exec with QueryExecModeSimpleProtocol", "a:7", err)
		err = p.QueryRow(as("a"), q, pgx.QueryExecModeSimpleProtocol, 7).Scan(&s)
		check("QueryRow with QueryExecModeSimpleProtocol", s, err)
		err = p.QueryRow(as("a"), q, pgx.QueryResultFormats{pgx.TextFormatCode}, 7).Scan(&s)
		check("QueryRow with QueryResultFormats", s, err)
		err = p.QueryRow(as("a"), "select pg_catalog.current_setting('app.tenant_id') || ':' || @n::int", pgx.NamedArgs{"n": 7}).Scan(&s)
		check("QueryRow with NamedArgs", s, err)
		rows, err := p.Query(as("a"), q, pgx.QueryExecModeDescribeExec, 7)
		if err == nil {
			s, err = pgx.CollectOneRow(rows, pgx.RowTo[string])
		}
		check("Query with QueryExecModeDescribeExec", s, err)
		c, err := p.Acquire(as("a"))
		if err != nil {
			t.Fatal(err)
		}
		err = c.QueryRow(as("a"), q, pgx.QueryExecModeSimpleProtocol, 7).Scan(&s)
		c.Release()
		check("Conn.QueryRow with QueryExecModeSimpleProtocol", s, err)
		assertNothingHeld(t, p)
		p.Close()
	}
}

// TestNotificationsStayWithTheirTenant: a holder that listened, received a
// notification and stopped listening leaves nothing for the next tenant's
// WaitForNotification (pgx had buffered it); TestResetDropsBufferedNotifications
// has a holder that still listens at release.
func TestNotificationsStayWithTheirTenant(t *testing.T) {
	p := newPool(t, sharedPG, 1, tenantdb.Config{Plans: map[string]tenantdb.Plan{"p": {MaxConns: 1, MaxWaiting: 5, MaxWait: time.Minute}}, DefaultPlan: "p"})
	c, err := p.Acquire(as("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(as("a"), "listen secrets; notify secrets, 'for a only'; select 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(as("a"), "unlisten *"); err != nil {
		t.Fatal(err)
	}
	c.Release()
	c, err = p.Acquire(as("b"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(as("b"), 200*time.Millisecond)
	n, err := c.Conn().WaitForNotification(ctx)
	cancel()
	c.Release()
	if n != nil {
		t.Fatalf("b received a's notification %q", n.Payload)
	}
	if err == nil {
		t.Fatal("WaitForNotification returned no notification and no error")
	}
}

// TestUntouchedReleaseAllocatesNothing: an Acquire and Release that ran no
// statement allocate nothing: the reset at release runs, in a goroutine of
// its own, only for a session a statement touched (pgxpool's AfterRelease
// hook started one at every release: 3 allocations). The Conn of a run that
// did run a statement still gets its session reset: the setting it left is
// gone for the next holder.
func TestUntouchedReleaseAllocatesNothing(t *testing.T) {
	p := newPool(t, sharedPG, 1, tenantdb.Config{Plans: map[string]tenantdb.Plan{"p": {MaxConns: 1, MaxWaiting: 5, MaxWait: time.Minute}}, DefaultPlan: "p"})
	ctx := as("a")
	cycle := func() {
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.Release()
	}
	cycle() // the connection is open
	// pgxpool hands out its Conn values from a slab of 128 per connection:
	// one allocation per 128 acquires, which the average rounds away.
	if allocs := testing.AllocsPerRun(1000, cycle); allocs != 0 {
		t.Fatalf("Acquire and Release of an untouched connection: %v allocations, want 0", allocs)
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "set app.leftover = 'a'"); err != nil {
		t.Fatal(err)
	}
	c.Release()
	// After a's streak of acquires its releases leave the reset to the next
	// holder: another tenant gets the session reset.
	var left string
	if err := p.QueryRow(as("b"), "select coalesce(pg_catalog.current_setting('app.leftover', true), '')").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != "" {
		t.Fatalf("the session a statement touched was not reset for the next tenant: app.leftover %q", left)
	}
	assertNothingHeld(t, p)
}

// TestResetRunsBeforeTheUsersAfterRelease: with an AfterRelease of the
// user's own in the pgxpool.Config, the reset at release runs in pgxpool's
// hook, before the user's, which sees the session reset; the user's hook
// still runs for a connection no statement touched.
func TestResetRunsBeforeTheUsersAfterRelease(t *testing.T) {
	pcfg := pgxConfig(t, sharedPG, 1)
	var calls atomic.Int32
	leftovers := make(chan string, 10)
	pcfg.AfterRelease = func(c *pgx.Conn) bool {
		calls.Add(1)
		var left string
		if err := c.QueryRow(context.Background(), "select coalesce(pg_catalog.current_setting('app.leftover', true), '')").Scan(&left); err != nil {
			left = err.Error()
		}
		leftovers <- left
		return true
	}
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"p": {MaxConns: 1, MaxWaiting: 5, MaxWait: time.Minute}}, DefaultPlan: "p"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Exec(as("a"), "set app.leftover = 'a'"); err != nil {
		t.Fatal(err)
	}
	if left := <-leftovers; left != "" {
		t.Fatalf("the user's AfterRelease saw the holder's session: app.leftover %q", left)
	}
	c, err := p.Acquire(as("b"))
	if err != nil {
		t.Fatal(err)
	}
	c.Release()
	<-leftovers
	if n := calls.Load(); n != 2 {
		t.Fatalf("the user's AfterRelease ran %d times for 2 releases", n)
	}
	assertNothingHeld(t, p)
}

// TestAcquireAgainAfterPgxpoolGaveUp: when the PrepareConn hook refused
// every connection pgxpool tried (MaxConns + 1 of them: tenantdb's refuses a
// session left to its next holder that listened, and under load other
// tenants' releases can keep bringing such sessions back), pgxpool gives up,
// and the call is not failed for it: tenantdb acquires again. The user's
// hook stands in for the refusals here, and plain pgxpool shows the error
// whose message package rejected recognises.
func TestAcquireAgainAfterPgxpoolGaveUp(t *testing.T) {
	const maxConns = 2
	var refuse atomic.Int32
	pcfg := pgxConfig(t, sharedPG, maxConns)
	pcfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		return refuse.Add(-1) < 0, nil
	}
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: maxConns}}})
	if err != nil {
		t.Fatal(err)
	}
	defer closeWithin(t, p, time.Minute)

	refuse.Store(maxConns + 1)
	c, err := p.Pgxpool().Acquire(context.Background())
	if err == nil {
		c.Release()
		t.Fatal("plain pgxpool acquired after MaxConns + 1 refusals: the test no longer provokes it")
	}
	if !strings.HasPrefix(err.Error(), "pgxpool: too many failed attempts acquiring connection") {
		t.Fatalf("plain pgxpool: %v, not the message package rejected recognises", err)
	}
	calls := map[string]func(ctx context.Context) error{
		"Exec": func(ctx context.Context) error { _, err := p.Exec(ctx, "select 1"); return err },
		"Ping": p.Ping,
		"Acquire": func(ctx context.Context) error {
			c, err := p.Acquire(ctx)
			if err == nil {
				c.Release()
			}
			return err
		},
	}
	for name, call := range calls {
		refuse.Store(maxConns + 1)
		if err := call(as("acme")); err != nil {
			t.Errorf("%s after MaxConns + 1 refused connections: %v", name, err)
		}
		if n := refuse.Load(); n >= 0 {
			t.Errorf("%s: %d refusals left: pgxpool did not give up before tenantdb acquired again", name, n+1)
		}
		assertInUse(t, p, "acme", 0, "after "+name)
	}
}

// TestResetRoleSurvivesRollback: the reset has no RESET ROLE (DISCARD ALL
// has none either): SET SESSION AUTHORIZATION DEFAULT gives role its value
// at connection. Were the holder's SET ROLE only masked, not undone, a
// later end of a transaction or subtransaction that restores role (a
// set_config(..., true), a SET ROLE rolled back) would bring it back; the
// next tenant is the login role after each.
func TestResetRoleSurvivesRollback(t *testing.T) {
	setupSessionState(t)
	for name, undo := range map[string]func(p *tenantdb.Pool) error{
		"set_config('role', ..., true)": func(p *tenantdb.Pool) error {
			_, err := p.Exec(as("b"), "select set_config('role', 'none', true)")
			return err
		},
		"SET ROLE rolled back": func(p *tenantdb.Pool) error {
			return pgx.BeginFunc(as("b"), p, func(tx pgx.Tx) error {
				if _, err := tx.Exec(as("b"), "set role none"); err != nil {
					return err
				}
				return errors.New("roll back")
			})
		},
		"a savepoint rolled back": func(p *tenantdb.Pool) error {
			_, err := p.Exec(as("b"), "begin; savepoint s; set role none; rollback to savepoint s; commit")
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := newStatePool(t, false, false)
			if _, err := p.Exec(as("a"), "set role "+bypassRole); err != nil {
				t.Fatal(err)
			}
			var user string
			if err := p.QueryRow(as("b"), "select current_user").Scan(&user); err != nil || user != rlsRole {
				t.Fatalf("b after a's SET ROLE: current_user %q (%v), want %q", user, err, rlsRole)
			}
			if err := undo(p); err != nil && err.Error() != "roll back" {
				t.Fatal(err)
			}
			if err := p.QueryRow(as("b"), "select current_user").Scan(&user); err != nil || user != rlsRole {
				t.Fatalf("b after its own %s: current_user %q (%v), want %q: a's role came back", name, user, err, rlsRole)
			}
			assertNothingHeld(t, p)
		})
	}
}
