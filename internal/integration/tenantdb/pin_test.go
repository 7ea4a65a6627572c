package tenantdb_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/internal/pgtest"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// setupPins creates pin_docs under a row-level security policy on
// app.tenant_id (a has 2 rows, b 1), a schema pin_private whose pin_docs
// holds every tenant's rows without a policy, and bypassRole (of
// sessionstate_test.go); it returns a DSN for rlsRole.
func setupPins(t *testing.T) string {
	t.Helper()
	return pgtest.AppRole(t, sharedPG.DSN, rlsRole, `
drop table if exists pin_docs;
drop schema if exists pin_private cascade;
create table pin_docs (tenant text not null, body text not null);
alter table pin_docs enable row level security;
alter table pin_docs force row level security;
create policy tenant_isolation on pin_docs using (tenant = current_setting('app.tenant_id', true));
insert into pin_docs values ('a', 'a1'), ('a', 'a2'), ('b', 'b1');
create schema pin_private;
create table pin_private.pin_docs as select * from pin_docs;
do $$ begin
	if not exists (select from pg_roles where rolname = '`+bypassRole+`') then
		create role `+bypassRole+` nologin bypassrls;
	end if;
end $$;
grant `+bypassRole+` to `+rlsRole+`;
grant select on pin_docs to `+rlsRole+`, `+bypassRole+`;
grant usage on schema pin_private to `+rlsRole+`;
grant select on pin_private.pin_docs to `+rlsRole+`;
`)
}

// pinRead is tenant b's read: the tenants of the pin_docs rows it sees (b's
// own: "b") and the role it runs as.
const pinRead = "select coalesce(string_agg(tenant, ',' order by tenant), ''), current_user::text from pin_docs"

// TestScopeTransactionPinsRoleAndSearchPath reproduces issue 25's table
// through PgBouncer in pool_mode=transaction with two server connections:
// while tenant a's code runs one session-level statement in a loop, tenant
// b's reads on three goroutines must see only b's rows, as the login role.
//
// Each case first runs b's reads with the tenant setting alone (what
// ScopeTransaction sent before it pinned the role and the search_path) and
// requires that some see a's rows: the proof that the case leaves what it
// is meant to leave. Then the same reads through the Pool must see none.
func TestScopeTransactionPinsRoleAndSearchPath(t *testing.T) {
	setupPins(t)
	cases := []struct{ name, leftover string }{
		{"set role to a role with BYPASSRLS", "set role " + bypassRole},
		{"a temporary table in front of the real one", "create temp table if not exists pin_docs as select * from pin_docs"},
		{"set search_path", "set search_path = pin_private, public"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bouncer := tenantdbtest.StartPgBouncer(t, sharedPG,
				tenantdbtest.WithPoolMode(tenantdbtest.PoolModeTransaction),
				tenantdbtest.WithPoolSize(2),
				tenantdbtest.WithPgBouncerUser(rlsRole, "app"))
			bdsn := bouncer.DSNFor(rlsRole, "app") + "&default_query_exec_mode=exec"
			p := newTransactionPool(t, pgxConfigOn(t, bdsn, 8), 4)
			// The setting alone, in the statement's implicit transaction.
			settingOnly := rawPoolOn(t, bdsn, 4)
			readSettingOnly := func(ctx context.Context) pgx.Row {
				b := &pgx.Batch{}
				b.Queue("select set_config('app.tenant_id', 'b', true)")
				b.Queue(pinRead)
				return batchRow{settingOnly.SendBatch(ctx, b)}
			}
			readPool := func(ctx context.Context) pgx.Row { return p.QueryRow(tenantdb.WithTenant(ctx, "b"), pinRead) }

			before := pinRun(t, p, c.leftover, readSettingOnly)
			t.Logf("with the setting alone, %d of %d reads of b saw other rows or ran as another role: %v",
				before.leaks(), before.statements, before.wrong)
			if before.leaks() == 0 {
				t.Fatalf("no read of %d saw what a left: the test cannot see the leak it is for", before.statements)
			}
			after := pinRun(t, p, c.leftover, readPool)
			t.Logf("through the Pool, %d of %d reads of b saw other rows or ran as another role: %v",
				after.leaks(), after.statements, after.wrong)
			if len(after.failed) > 0 {
				t.Errorf("unexpected errors:\n%s", strings.Join(after.failed, "\n"))
			}
			if after.leaks() > 0 {
				t.Fatalf("%d of %d reads of b saw other rows or ran as another role: %v", after.leaks(), after.statements, after.wrong)
			}
			assertNothingHeld(t, p)
		})
	}
}

// newTransactionPool is a Pool on pcfg whose tenants may each hold capacity
// connections, with the tenant setting in ScopeTransaction; it is closed at
// the end of the test.
func newTransactionPool(t *testing.T, pcfg *pgxpool.Config, capacity int) *tenantdb.Pool {
	t.Helper()
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:   map[string]tenantdb.Plan{"std": {MaxConns: capacity}},
		Session: tenantdb.Session{TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// pinRun runs leftover as tenant a through p in a loop while three
// goroutines read 40 times each as tenant b with read, and tallies b's
// reads.
func pinRun(t *testing.T, p *tenantdb.Pool, leftover string, read func(context.Context) pgx.Row) *proxyTally {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tally := &proxyTally{wrong: map[string]int{}}
	readers := sync.WaitGroup{}
	stop := make(chan struct{})
	var leftovers atomic.Int64
	var a sync.WaitGroup
	a.Go(func() {
		ctx := tenantdb.WithTenant(ctx, "a")
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := p.Exec(ctx, leftover); err == nil {
				leftovers.Add(1)
			} else if ctx.Err() != nil {
				return
			}
		}
	})
	for range 3 {
		readers.Go(func() {
			for range 40 {
				var tenants, role string
				if err := read(ctx).Scan(&tenants, &role); err != nil {
					tally.fail("b's read", err)
					continue
				}
				tally.saw("b", fmt.Sprintf("saw %q as %s", tenants, role), tenants == "b" && role == rlsRole)
			}
		})
	}
	readers.Wait()
	close(stop)
	a.Wait()
	if leftovers.Load() == 0 {
		t.Fatalf("a's %q never succeeded", leftover)
	}
	return tally
}

// batchRow is the second result of a batch as a pgx.Row, closing the batch
// when scanned.
type batchRow struct{ br pgx.BatchResults }

func (r batchRow) Scan(dest ...any) error {
	_, err := r.br.Exec()
	if err == nil {
		err = r.br.QueryRow().Scan(dest...)
	}
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// TestScopeTransactionBeginWithOptions: under ScopeTransaction a transaction
// begun with an isolation level, by BeginTx, by a batch's BeginTx or by an
// SQL BEGIN on a Conn, runs at that level with the tenant's values: the
// values go after the BEGIN, which must come first in its transaction.
func TestScopeTransactionBeginWithOptions(t *testing.T) {
	p := newScopedRLSPool(t, setupRLS(t), 1, tenantdb.ScopeTransaction, nil)
	ctx := as("a")
	const check = "select current_setting('transaction_isolation'), current_setting('app.tenant_id', true), current_user::text"
	want := func(how string, row pgx.Row) {
		t.Helper()
		var level, setting, role string
		if err := row.Scan(&level, &setting, &role); err != nil {
			t.Errorf("%s: %v", how, err) // not Fatal: the transaction must end for Close
			return
		}
		if level != "serializable" || setting != "a" || role != rlsRole {
			t.Errorf("%s: isolation %q, setting %q, role %q; want serializable, a, %s", how, level, setting, role, rlsRole)
		}
	}

	tx, err := p.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	want("BeginTx", tx.QueryRow(ctx, check))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.Serializable})
	b.Queue(check)
	br := p.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		var level, setting, role string
		err = br.QueryRow().Scan(&level, &setting, &role)
		if err == nil && (level != "serializable" || setting != "a" || role != rlsRole) {
			err = fmt.Errorf("isolation %q, setting %q, role %q; want serializable, a, %s", level, setting, role, rlsRole)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if tx := br.Tx(); tx != nil {
		_ = tx.Rollback(ctx)
	}
	if err != nil {
		t.Fatalf("a batch's BeginTx: %v", err)
	}

	err = p.AcquireFunc(ctx, func(c tenantdb.Conn) error {
		if _, err := c.Exec(ctx, "begin isolation level serializable"); err != nil {
			return err
		}
		want("an SQL BEGIN on a Conn", c.QueryRow(ctx, check))
		_, err := c.Exec(ctx, "rollback")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	assertNothingHeld(t, p)
}

// TestScopeTransactionDefaultSearchPath: without Session.SearchPath the
// pinned search_path is the login role's default (here a startup
// parameter) with pg_temp last, whatever the session's own search_path
// says, and the role is the login role whatever SET ROLE the session had.
func TestScopeTransactionDefaultSearchPath(t *testing.T) {
	dsn := setupPins(t)
	pcfg := pgxConfigOn(t, dsn+"&default_query_exec_mode=exec", 1)
	pcfg.ConnConfig.RuntimeParams["search_path"] = "pin_private, public"
	p := newTransactionPool(t, pcfg, 1)
	ctx := as("b")
	// The tenant's own code changes its session; the next statement is pinned.
	if _, err := p.Exec(ctx, "set search_path = public; set role "+bypassRole); err != nil {
		t.Fatal(err)
	}
	var path, role string
	if err := p.QueryRow(ctx, "select current_setting('search_path'), current_user::text").Scan(&path, &role); err != nil {
		t.Fatal(err)
	}
	if path != "pin_private, public, pg_temp" || role != rlsRole {
		t.Fatalf("search_path %q as %s; want the startup parameter's with pg_temp last, as %s", path, role, rlsRole)
	}
}

// localTracer records the first statement of every batch pgx sends, where
// ScopeTransaction puts the tenant's local values.
type localTracer struct {
	mu    sync.Mutex
	first []string
	next  bool // the next TraceBatchQuery is a batch's first
}

func (l *localTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (l *localTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *localTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	l.mu.Lock()
	l.next = true
	l.mu.Unlock()
	return ctx
}
func (l *localTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.next {
		l.first, l.next = append(l.first, data.SQL), false
	}
}
func (l *localTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// last returns the first statement of the last batch.
func (l *localTracer) last() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.first) == 0 {
		return ""
	}
	return l.first[len(l.first)-1]
}

// TestScopeTransactionPinsWhereTheSessionIsUnknown: every transaction under
// ScopeTransaction pins the role and search_path, on a direct connection as
// behind PgBouncer in pool_mode=transaction (where the reset and the
// statement may run on two server connections), and sees only its own rows
// as the login role whatever the previous tenant, or the tenant's own SQL,
// left in the session.
func TestScopeTransactionPinsWhereTheSessionIsUnknown(t *testing.T) {
	dsn := setupPins(t)
	bouncer := tenantdbtest.StartPgBouncer(t, sharedPG,
		tenantdbtest.WithPoolMode(tenantdbtest.PoolModeTransaction),
		tenantdbtest.WithPoolSize(1),
		tenantdbtest.WithPgBouncerUser(rlsRole, "app"))
	for _, c := range []struct {
		name     string
		dsn      string
		pinFirst bool // whether the transaction after a change of tenant is pinned: always, since the reset at release
	}{
		{"direct", dsn, true},
		{"PgBouncer pool_mode=transaction", bouncer.DSNFor(rlsRole, "app"), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tracer := &localTracer{}
			pcfg := pgxConfigOn(t, c.dsn+"&default_query_exec_mode=exec", 1)
			pcfg.ConnConfig.Tracer = tracer
			p := newTransactionPool(t, pcfg, 1)
			pinned := func(sql string) bool {
				return strings.Contains(sql, "'role'") && strings.Contains(sql, "'search_path'")
			}
			read := func(tenant string) {
				t.Helper()
				var tenants, role string
				if err := p.QueryRow(as(tenant), pinRead).Scan(&tenants, &role); err != nil {
					t.Fatal(err)
				}
				if tenants != tenant || role != rlsRole {
					t.Fatalf("%s saw the rows of %q as %s; want its own as %s", tenant, tenants, role, rlsRole)
				}
			}
			// a leaves a role with BYPASSRLS, a search_path to the table
			// without a policy, and a temporary table in front of the real one.
			if _, err := p.Exec(as("a"), "create temp table pin_docs as select * from pin_private.pin_docs; "+
				"set search_path = pin_private, public; set role "+bypassRole); err != nil {
				t.Fatal(err)
			}
			read("b")
			if got := pinned(tracer.last()); got != c.pinFirst || !strings.Contains(tracer.last(), "app.tenant_id") {
				t.Fatalf("after a change of tenant b's transaction began with %q: pinned %t, want %t", tracer.last(), got, c.pinFirst)
			}
			// b's own SQL changes its session; its next transaction is pinned.
			if _, err := p.Exec(as("b"), "set role "+bypassRole+"; set search_path = pin_private, public"); err != nil {
				t.Fatal(err)
			}
			read("b")
			if !pinned(tracer.last()) {
				t.Fatalf("b's transaction on its own session began with %q: not pinned", tracer.last())
			}
			assertNothingHeld(t, p)
		})
	}
}
