package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/internal/pgtest"
	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// rlsRole is a role without SUPERUSER or BYPASSRLS: row-level security
// policies apply to it.
const rlsRole = "tenantdb_rls_app"

// setupRLS creates, as the superuser, a table with a row-level security
// policy on app.tenant_id (tenant a has 2 rows, b 1) and a schema per tenant
// (tenant_a, tenant_b, each with items and uploads), and returns a DSN for
// rlsRole.
func setupRLS(t *testing.T) string {
	t.Helper()
	return pgtest.AppRole(t, sharedPG.DSN, rlsRole, `
drop table if exists rls_docs;
drop schema if exists tenant_a cascade;
drop schema if exists tenant_b cascade;
create table rls_docs (tenant text not null, body text not null);
alter table rls_docs enable row level security;
alter table rls_docs force row level security;
create policy tenant_isolation on rls_docs
	using (tenant = current_setting('app.tenant_id', true))
	with check (tenant = current_setting('app.tenant_id', true));
grant select, insert on rls_docs to `+rlsRole+`;
insert into rls_docs values ('a', 'a1'), ('a', 'a2'), ('b', 'b1');
create schema tenant_a;
create schema tenant_b;
create table tenant_a.items (name text);
create table tenant_b.items (name text);
create table tenant_a.uploads (name text);
create table tenant_b.uploads (name text);
insert into tenant_a.items values ('in a');
insert into tenant_b.items values ('in b');
grant usage on schema tenant_a, tenant_b to `+rlsRole+`;
grant select, insert on tenant_a.items, tenant_b.items, tenant_a.uploads, tenant_b.uploads to `+rlsRole+`;
`)
}

func newRLSPool(t *testing.T, dsn string, maxConns int32, searchPath func(string) []string) *tenantdb.Pool {
	t.Helper()
	return newRLSPoolWith(t, dsn, maxConns, tenantdb.Plan{MaxConns: 1}, searchPath)
}

func newRLSPoolWith(t *testing.T, dsn string, maxConns int32, plan tenantdb.Plan, searchPath func(string) []string) *tenantdb.Pool {
	t.Helper()
	pcfg := pgxConfig(t, sharedPG, maxConns)
	app, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.User, pcfg.ConnConfig.Password = app.User, app.Password
	if searchPath == nil {
		searchPath = func(id string) []string { return []string{"tenant_" + id, "public"} }
	}
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"std": plan},
		Session: tenantdb.Session{
			TenantSetting: "app.tenant_id",
			SearchPath:    searchPath,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// probe reads what a connection shows its holder: the tenants of the rows
// the policy lets it see, and the items table its search_path finds.
const probe = "select array(select tenant from rls_docs order by body), (select name from items)"

var wantProbe = map[string]struct {
	tenants []string
	item    string
}{
	"a": {[]string{"a", "a"}, "in a"},
	"b": {[]string{"b"}, "in b"},
}

func checkProbe(t *testing.T, tenant, via string, tenants []string, item string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s as %s: %v", via, tenant, err)
	}
	want := wantProbe[tenant]
	if !slices.Equal(tenants, want.tenants) || item != want.item {
		t.Fatalf("%s as %s saw rows of %v and items %q; want rows of %v and items %q",
			via, tenant, tenants, item, want.tenants, want.item)
	}
}

// readAs runs the probe for tenant through every way the Pool uses a
// connection.
func readAs(t *testing.T, p *tenantdb.Pool, tenant string) {
	t.Helper()
	ctx := as(tenant)
	var tenants []string
	var item string

	err := p.QueryRow(ctx, probe).Scan(&tenants, &item)
	checkProbe(t, tenant, "QueryRow", tenants, item, err)

	rows, err := p.Query(ctx, probe)
	if err == nil {
		tenants, item, err = collectProbe(rows)
	}
	checkProbe(t, tenant, "Query", tenants, item, err)

	tag, err := p.Exec(ctx, "select from rls_docs")
	if err != nil || tag.RowsAffected() != int64(len(wantProbe[tenant].tenants)) {
		t.Fatalf("Exec as %s: %v rows, err %v; want %d", tenant, tag.RowsAffected(), err, len(wantProbe[tenant].tenants))
	}

	b := &pgx.Batch{}
	b.Queue(probe)
	br := p.SendBatch(ctx, b)
	err = br.QueryRow().Scan(&tenants, &item)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	checkProbe(t, tenant, "SendBatch", tenants, item, err)

	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error { return tx.QueryRow(ctx, probe).Scan(&tenants, &item) })
	checkProbe(t, tenant, "BeginFunc", tenants, item, err)

	err = p.AcquireFunc(ctx, func(c tenantdb.Conn) error { return c.QueryRow(ctx, probe).Scan(&tenants, &item) })
	checkProbe(t, tenant, "AcquireFunc", tenants, item, err)

	n, err := p.CopyFrom(ctx, pgx.Identifier{"uploads"}, []string{"name"}, pgx.CopyFromRows([][]any{{"from " + tenant}}))
	if err != nil || n != 1 {
		t.Fatalf("CopyFrom as %s: %d rows, %v", tenant, n, err)
	}
}

func collectProbe(rows pgx.Rows) (tenants []string, item string, err error) {
	defer rows.Close()
	if !rows.Next() {
		return nil, "", fmt.Errorf("no row: %v", rows.Err())
	}
	if err := rows.Scan(&tenants, &item); err != nil {
		return nil, "", err
	}
	rows.Close()
	return tenants, item, rows.Err()
}

// checkUploads checks, as the superuser, that each tenant's CopyFrom rows
// landed in its own schema only.
func checkUploads(t *testing.T, want map[string]int) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, tenant := range []string{"a", "b"} {
		rows, _ := admin.Query(ctx, "select name from "+pgx.Identifier{"tenant_" + tenant, "uploads"}.Sanitize())
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(names) != want[tenant] {
			t.Errorf("tenant_%s.uploads has %d rows, want %d", tenant, len(names), want[tenant])
		}
		for _, n := range names {
			if n != "from "+tenant {
				t.Errorf("tenant_%s.uploads holds %q", tenant, n)
			}
		}
	}
}

// TestSessionStateIsolatesTenants proves on PostgreSQL with row-level
// security that tenants taking turns on one shared connection see only their
// own rows and schema, whatever the previous holder did.
func TestSessionStateIsolatesTenants(t *testing.T) {
	dsn := setupRLS(t)
	p := newRLSPool(t, dsn, 1, nil) // one shared connection: every call reuses it

	var pids []uint32
	pid := func(tenant string) uint32 {
		var id uint32
		if err := p.AcquireFunc(as(tenant), func(c tenantdb.Conn) error { id = c.Conn().PgConn().PID(); return nil }); err != nil {
			t.Fatal(err)
		}
		return id
	}
	for range 3 {
		readAs(t, p, "a")
		pids = append(pids, pid("a"))
		readAs(t, p, "b")
		pids = append(pids, pid("b"))
	}
	checkUploads(t, map[string]int{"a": 3, "b": 3})
	if pids = slices.Compact(pids); len(pids) != 1 {
		t.Logf("the shared connection was replaced during the run (pids %v)", pids)
	}

	t.Run("after a panic in AcquireFunc", func(t *testing.T) {
		func() {
			defer func() { _ = recover() }()
			_ = p.AcquireFunc(as("a"), func(c tenantdb.Conn) error {
				if _, err := c.Exec(context.Background(), "select 1"); err != nil {
					return err
				}
				panic("boom")
			})
		}()
		readAs(t, p, "b")
	})
	t.Run("after a panic in BeginFunc", func(t *testing.T) {
		func() {
			defer func() { _ = recover() }()
			_ = pgx.BeginFunc(as("a"), p, func(tx pgx.Tx) error {
				if _, err := tx.Exec(context.Background(), "select 1"); err != nil {
					return err
				}
				panic("boom")
			})
		}()
		readAs(t, p, "b")
	})
	t.Run("after the holder changed the settings itself", func(t *testing.T) {
		change := func(tenant string) {
			err := p.AcquireFunc(as(tenant), func(c tenantdb.Conn) error {
				_, err := c.Exec(context.Background(),
					"select set_config('app.tenant_id', 'b', false), set_config('search_path', 'tenant_b', false)")
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		change("a")
		readAs(t, p, "b") // the next tenant gets its own values
		// The same tenant gets either its own values back (the reset at
		// release) or, when it was waiting for the connection, its own
		// session as its SQL left it; never another tenant's.
		change("a")
		var setting string
		if err := p.QueryRow(as("a"), "select current_setting('app.tenant_id')").Scan(&setting); err != nil || setting != "a" && setting != "b" {
			t.Fatalf("a's next request saw app.tenant_id %q (%v)", setting, err)
		}
		readAs(t, p, "b")
		readAs(t, p, "a")
	})
	t.Run("after its backend was killed", func(t *testing.T) {
		killed := pid("a")
		admin, err := pgx.Connect(context.Background(), sharedPG.DSN)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(context.Background(), "select pg_terminate_backend($1)", killed); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the backend is gone", func() bool {
			var n int
			err := admin.QueryRow(context.Background(), "select count(*) from pg_stat_activity where pid = $1", killed).Scan(&n)
			return err == nil && n == 0
		})
		// The pool still holds the dead connection; setting it up fails, so
		// it is destroyed and the call goes on a new one without an error.
		readAs(t, p, "b")
		if now := pid("b"); now == killed {
			t.Fatalf("served on the killed backend %d", killed)
		}
	})
	t.Run("without a tenant", func(t *testing.T) {
		var tenants []string
		var setting, path string
		err := p.Pgxpool().QueryRow(context.Background(),
			"select array(select tenant from rls_docs), current_setting('app.tenant_id', true), current_setting('search_path')").
			Scan(&tenants, &setting, &path)
		if err != nil {
			t.Fatal(err)
		}
		if len(tenants) != 0 || setting != "" || path != `"$user", public` {
			t.Fatalf("without a tenant: rows of %v, app.tenant_id %q, search_path %q; want none, '' and the default",
				tenants, setting, path)
		}
	})
	checkUploads(t, map[string]int{"a": 3 + 1, "b": 3 + 5})
	assertNothingHeld(t, p)
}

// TestSessionStateWithRowsReadLazily interleaves two tenants' open Rows on
// two shared connections: each connection keeps its holder's state until the
// rows are closed.
func TestSessionStateWithRowsReadLazily(t *testing.T) {
	p := newRLSPool(t, setupRLS(t), 2, nil)
	const q = "select tenant, (select name from items) from rls_docs, generate_series(1, 50)"
	ra, err := p.Query(as("a"), q)
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Close()
	rb, err := p.Query(as("b"), q)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	seen := map[string]int{}
	for more := true; more; {
		more = false
		for tenant, rows := range map[string]pgx.Rows{"a": ra, "b": rb} {
			if !rows.Next() {
				continue
			}
			more = true
			var rowTenant, item string
			if err := rows.Scan(&rowTenant, &item); err != nil {
				t.Fatal(err)
			}
			if rowTenant != tenant || item != "in "+tenant {
				t.Fatalf("%s read a row of %s with items %q", tenant, rowTenant, item)
			}
			seen[tenant]++
		}
	}
	if ra.Err() != nil || rb.Err() != nil {
		t.Fatal(ra.Err(), rb.Err())
	}
	if seen["a"] != 100 || seen["b"] != 50 {
		t.Fatalf("read %v rows, want a:100 b:50", seen)
	}
	assertNothingHeld(t, p)
}

// TestSessionSetupFailureHoldsNothing: a failed setup fails that call only,
// with the slot and the connection returned.
func TestSessionSetupFailureHoldsNothing(t *testing.T) {
	p := newRLSPool(t, setupRLS(t), 1, func(id string) []string {
		switch id {
		case "panics":
			panic("no schema for this tenant")
		case "empty":
			return []string{""}
		}
		return []string{"tenant_" + id, "public"}
	})
	for _, tenant := range []string{"panics", "empty"} {
		var n int
		err := p.QueryRow(as(tenant), "select 1").Scan(&n)
		if err == nil {
			t.Fatalf("%s: the call succeeded without its session state", tenant)
		}
		t.Logf("%s: %v", tenant, err)
		assertNothingHeld(t, p)
	}
	readAs(t, p, "a")
	assertNothingHeld(t, p)
}

func TestSessionRejectsBadSettingName(t *testing.T) {
	for _, name := range []string{"tenant_id", "app.", ".tenant", "app.tenant-id", "app.tenant id", "1app.x", "app.x'; drop table t; --"} {
		_, err := tenantdb.New(context.Background(), pgxConfig(t, sharedPG, 4), tenantdb.Config{
			Session: tenantdb.Session{TenantSetting: name},
		})
		if !errors.Is(err, pool.ErrInvalidConfig) {
			t.Errorf("TenantSetting %q: err = %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestSessionStateUnderCancellation cancels calls at random moments, some
// during the session setup itself, on two shared connections: every call that
// succeeds saw its own tenant's rows only, and nothing is held afterwards.
// Every tenth call has no deadline, so that calls finish among the cancelled
// ones however slow the machine: with only deadlines under 200 ms, a loaded
// machine (go test ./... beside other packages) let none finish, and the test
// failed without telling anything about session state.
func TestSessionStateUnderCancellation(t *testing.T) {
	p := newRLSPoolWith(t, setupRLS(t), 2, tenantdb.Plan{MaxConns: 1, MaxWaiting: 200}, nil)
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := []string{"a", "b"}[i%2]
			ctx := as(tenant)
			if i%10 != 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(200_000))*time.Microsecond)
				defer cancel()
			}
			var tenants []string
			var item string
			var err error
			if i%3 == 0 {
				err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error { return tx.QueryRow(ctx, probe).Scan(&tenants, &item) })
			} else {
				err = p.QueryRow(ctx, probe).Scan(&tenants, &item)
			}
			if err != nil {
				failed.Add(1)
				return
			}
			ok.Add(1)
			if want := wantProbe[tenant]; !slices.Equal(tenants, want.tenants) || item != want.item {
				t.Errorf("%s saw rows of %v and items %q", tenant, tenants, item)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d succeeded, %d failed", ok.Load(), failed.Load())
	if ok.Load() == 0 || failed.Load() == 0 {
		t.Fatal("the storm should both cancel calls and let some finish")
	}
	assertNothingHeld(t, p)
	readAs(t, p, "a")
	readAs(t, p, "b")
	assertNothingHeld(t, p)
}
