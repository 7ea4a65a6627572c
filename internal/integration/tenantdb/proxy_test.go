package tenantdb_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// proxyProbe shows which tenant a statement ran as: the setting the RLS
// policy reads, how many rls_docs rows the policy let it see (a: 2, b: 1, no
// setting: 0), and which schema's items table its search_path found.
//
// The schema is looked up rather than read from, so that a statement whose
// search_path finds no items table (the defaults, restored by a reset on the
// same server connection) counts as run under none instead of failing.
const proxyProbe = "select coalesce(current_setting('app.tenant_id', true), ''), (select count(*) from rls_docs), " +
	"coalesce((select relnamespace::regnamespace::text from pg_class where oid = to_regclass('items')), 'no items')"

// proxyTally counts the statements a tenant ran and those that ran under
// another tenant's setting or none.
type proxyTally struct {
	mu         sync.Mutex
	statements int
	wrong      map[string]int // what the wrong statements saw
	failed     []string       // unexpected errors, first few
}

// saw counts one statement of tenant, which saw what (for the log) and ran
// as tenant or not.
func (c *proxyTally) saw(tenant, what string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.statements++
	if !ok {
		c.wrong[tenant+" "+what]++
	}
}

func (c *proxyTally) fail(what string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.failed) < 5 {
		c.failed = append(c.failed, what+": "+err.Error())
	} else if len(c.failed) == 5 {
		c.failed = append(c.failed, "...")
	}
}

func (c *proxyTally) leaks() int {
	n := 0
	for _, k := range c.wrong {
		n += k
	}
	return n
}

// TestTransactionPoolingProxy runs two tenants' statements concurrently
// through PgBouncer in pool_mode=transaction, with fewer server connections
// (2) than the tenantdb pool has client connections (8), so consecutive
// transactions of one client connection land on different server
// connections. Session has a TenantSetting and a SearchPath; every statement
// reports the setting it ran under, the rows the RLS policy let it see and
// the schema its search_path found.
//
// With ScopeSession the setting made at acquire and the statement are
// separate transactions: statements run under the other tenant's setting,
// and the test asserts that it sees them (proof that it could see a leak).
// With ScopeTransaction none may, nor with ScopeSession behind session
// pooling, which the README names as what ScopeSession needs.
//
// PgBouncer is Debian bookworm's 1.18, which does not track named prepared
// statements in transaction pooling (1.21 does, with
// max_prepared_statements), so pgx uses QueryExecModeExec: the extended
// protocol with the unnamed statement, parse to execute in one round trip.
func TestTransactionPoolingProxy(t *testing.T) {
	setupRLS(t) // rls_docs: a has 2 rows, b 1
	admin, err := pgx.Connect(t.Context(), sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(t.Context(), `
drop table if exists proxy_uploads;
create table proxy_uploads (
	tenant text not null, n int not null,
	copied_as text default coalesce(current_setting('app.tenant_id', true), ''));
grant insert on proxy_uploads to `+rlsRole)
	admin.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	run := func(t *testing.T, mode string, serverConns int, scope tenantdb.Scope) *proxyTally {
		bouncer := tenantdbtest.StartPgBouncer(t, sharedPG,
			tenantdbtest.WithPoolMode(mode),
			tenantdbtest.WithPoolSize(serverConns),
			tenantdbtest.WithPgBouncerUser(rlsRole, "app"),
		)
		pcfg := pgxConfig(t, &tenantdbtest.Postgres{DSN: bouncer.DSNFor(rlsRole, "app")}, 8)
		pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
			Plans: map[string]tenantdb.Plan{"std": {MaxConns: 4}},
			Session: tenantdb.Session{
				TenantSetting: "app.tenant_id",
				SearchPath:    func(id string) []string { return []string{"tenant_" + id, "public"} },
				Scope:         scope,
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()

		tally := &proxyTally{wrong: map[string]int{}}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		for _, tenant := range []string{"a", "b"} {
			for w := range 4 {
				wg.Go(func() {
					ctx := tenantdb.WithTenant(ctx, tenant)
					for i := range 30 {
						proxyStatements(ctx, p, tenant, w*1000+i, tally)
					}
				})
			}
		}
		wg.Wait()
		copied(t, tally)
		if len(tally.failed) > 0 {
			t.Errorf("unexpected errors:\n%s", strings.Join(tally.failed, "\n"))
		}
		assertNothingHeld(t, p)
		t.Logf("%d of %d statements ran under another tenant's setting or none: %v",
			tally.leaks(), tally.statements, tally.wrong)
		return tally
	}

	t.Run("ScopeSession leaks", func(t *testing.T) {
		tally := run(t, tenantdbtest.PoolModeTransaction, 2, tenantdb.ScopeSession)
		if tally.leaks() == 0 {
			t.Fatalf("no statement of %d ran under another tenant's setting: the test cannot see the leak it is for", tally.statements)
		}
	})
	t.Run("ScopeTransaction", func(t *testing.T) {
		tally := run(t, tenantdbtest.PoolModeTransaction, 2, tenantdb.ScopeTransaction)
		if n := tally.leaks(); n > 0 {
			t.Fatalf("%d of %d statements ran under another tenant's setting or none: %v", n, tally.statements, tally.wrong)
		}
	})
	// What ScopeSession needs: session pooling keeps a client connection on
	// one server connection, so it needs as many (8) as the pool has.
	t.Run("ScopeSession behind session pooling", func(t *testing.T) {
		tally := run(t, tenantdbtest.PoolModeSession, 8, tenantdb.ScopeSession)
		if n := tally.leaks(); n > 0 {
			t.Fatalf("%d of %d statements ran under another tenant's setting or none: %v", n, tally.statements, tally.wrong)
		}
	})
}

// proxyStatements runs one round of every way a tenantdb.Pool runs
// statements, each checked with the probe.
func proxyStatements(ctx context.Context, p *tenantdb.Pool, tenant string, n int, tally *proxyTally) {
	probe := func(what string, row pgx.Row) {
		var setting, item string
		var rows int64
		if err := row.Scan(&setting, &rows, &item); err != nil {
			tally.fail(what, err)
			return
		}
		want := wantProbe[tenant]
		tally.saw(tenant, fmt.Sprintf("ran as %q seeing %d rows and %q", setting, rows, item),
			setting == tenant && rows == int64(len(want.tenants)) && item == "tenant_"+tenant)
	}

	tag, err := p.Exec(ctx, "select from rls_docs where $1::int >= 0", n)
	if err != nil {
		tally.fail("Exec", err)
	} else {
		// The tag shows the rows only: a's 2, b's 1, none 0.
		tally.saw(tenant, fmt.Sprintf("Exec saw %d rows", tag.RowsAffected()),
			tag.RowsAffected() == int64(len(wantProbe[tenant].tenants)))
	}

	probe("QueryRow", p.QueryRow(ctx, proxyProbe))

	if r, err := p.Query(ctx, proxyProbe); err != nil {
		tally.fail("Query", err)
	} else {
		for r.Next() {
			probe("Query", r)
		}
		r.Close()
		if err := r.Err(); err != nil {
			tally.fail("Query", err)
		}
	}

	b := &pgx.Batch{}
	b.Queue(proxyProbe)
	b.Queue(proxyProbe)
	br := p.SendBatch(ctx, b)
	probe("SendBatch", br.QueryRow())
	probe("SendBatch", br.QueryRow())
	if err := br.Close(); err != nil {
		tally.fail("SendBatch", err)
	}

	if tx, err := p.Begin(ctx); err != nil {
		tally.fail("Begin", err)
	} else {
		probe("Begin", tx.QueryRow(ctx, proxyProbe))
		probe("Begin", tx.QueryRow(ctx, proxyProbe))
		if err := tx.Commit(ctx); err != nil {
			tally.fail("Commit", err)
		}
	}

	if c, err := p.Acquire(ctx); err != nil {
		tally.fail("Acquire", err)
	} else {
		probe("Conn.QueryRow", c.QueryRow(ctx, proxyProbe))
		if _, err := c.Exec(ctx, "select 1"); err != nil {
			tally.fail("Conn.Exec", err)
		}
		probe("Conn.QueryRow", c.QueryRow(ctx, proxyProbe))
		c.Release()
	}

	// COPY FROM refuses tables with row-level security; the row records
	// the setting it was copied under in a column default, read by copied.
	if _, err := p.CopyFrom(ctx, pgx.Identifier{"proxy_uploads"}, []string{"tenant", "n"},
		pgx.CopyFromRows([][]any{{tenant, n}})); err != nil {
		tally.fail("CopyFrom", err)
	}
}

// copied tallies the rows proxyStatements copied, by the setting each was
// copied under, and empties the table.
func copied(t *testing.T, tally *proxyTally) {
	t.Helper()
	admin, err := pgx.Connect(t.Context(), sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	rows, _ := admin.Query(t.Context(), "delete from proxy_uploads returning array[tenant, copied_as]")
	pairs, err := pgx.CollectRows(rows, pgx.RowTo[[2]string])
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range pairs {
		tally.saw(r[0], fmt.Sprintf("copied as %q", r[1]), r[1] == r[0])
	}
}
