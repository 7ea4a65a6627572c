package tenantsql_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/gorm"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

var scopeTx = tenantdb.Session{TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction}

// TestScopeTransactionPaths checks every way database/sql runs a statement
// under ScopeTransaction on a direct connection: a query, an Exec with and
// without arguments, a transaction and a prepared statement each see and
// write only their tenant's rows, and every slot is back afterwards.
func TestScopeTransactionPaths(t *testing.T) {
	dsn := setupRLS(t)
	p := newPool(t, dsn+"&default_query_exec_mode=exec", 2, tenantdb.Plan{MaxConns: 1}, scopeTx)
	db := openDB(t, p)
	count := func(tenant string) (n int) {
		t.Helper()
		if err := db.QueryRowContext(as(tenant), "select count(*) from docs").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	var setting, bodies string
	err := db.QueryRowContext(as("a"), "select current_setting('app.tenant_id'), string_agg(body, ',' order by body) from docs").Scan(&setting, &bodies)
	if err != nil || setting != "a" || bodies != "a1,a2" {
		t.Fatalf("a query as a saw setting %q and rows %q (%v); want a and a1,a2", setting, bodies, err)
	}
	if _, err := db.ExecContext(as("b"), "insert into docs (body) values ($1)", "b2"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(as("b"), "insert into docs (body) values ('b3'); insert into docs (body) values ('b4')"); err != nil {
		t.Fatal(err)
	}
	if a, b := count("a"), count("b"); a != 2 || b != 4 {
		t.Fatalf("after b's inserts a counts %d rows and b %d; want 2 and 4", a, b)
	}

	tx, err := db.BeginTx(as("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRowContext(as("a"), "select current_setting('app.tenant_id')").Scan(&setting); err != nil || setting != "a" {
		t.Fatalf("a transaction of a sees setting %q (%v)", setting, err)
	}
	if _, err := tx.ExecContext(as("a"), "insert into docs (body) values ('a3')"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := count("a"); n != 3 {
		t.Fatalf("a counts %d rows after its transaction; want 3", n)
	}

	stmt, err := db.PrepareContext(as("a"), "select count(*) from docs where body like $1")
	if err != nil {
		t.Fatal(err)
	}
	defer stmt.Close()
	for tenant, want := range map[string]int{"a": 3, "b": 4} {
		var n int
		if err := stmt.QueryRowContext(as(tenant), "%").Scan(&n); err != nil || n != want {
			t.Fatalf("a prepared statement as %s counts %d (%v); want %d", tenant, n, err, want)
		}
	}

	assertReleased(t, p, "a")
	assertReleased(t, p, "b")
}

// TestScopeTransactionBehindPgBouncer runs tenants a and b concurrently
// through GORM on OpenDB behind PgBouncer in transaction pooling mode with
// two server connections, so that consecutive statements of one client
// connection run on different server connections: with ScopeTransaction
// every statement, query and transaction still sees only its tenant's rows.
func TestScopeTransactionBehindPgBouncer(t *testing.T) {
	setupRLS(t)
	bouncer := tenantdbtest.StartPgBouncer(t, sharedPG,
		tenantdbtest.WithPoolMode(tenantdbtest.PoolModeTransaction),
		tenantdbtest.WithPoolSize(2),
		tenantdbtest.WithPgBouncerUser(rlsRole, "app"))
	pcfg, err := pgxpool.ParseConfig(bouncer.DSN)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.User, pcfg.ConnConfig.Password = rlsRole, "app"
	// PgBouncer 1.18 in transaction mode keeps no named prepared statements.
	pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pcfg.MaxConns = 4
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 2, MaxWaiting: 10, MaxWait: time.Minute}},
		Session: scopeTx,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	g := openGORM(t, openDB(t, p))

	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, tenant := range []string{"a", "b", "a", "b"} {
		wg.Go(func() {
			gt := g.WithContext(as(tenant))
			want := map[string]string{"a": "a1,a2", "b": "b1"}[tenant]
			for range 30 {
				var got string
				if err := gt.Raw("select coalesce(string_agg(body, ',' order by body), '') from docs").Scan(&got).Error; err != nil {
					errs <- fmt.Errorf("tenant %s: %w", tenant, err)
					return
				}
				if got != want {
					errs <- fmt.Errorf("tenant %s saw rows %q; want %q", tenant, got, want)
					return
				}
				var n int64
				if err := gt.Model(&Doc{}).Where("tenant <> ?", tenant).Count(&n).Error; err != nil || n != 0 {
					errs <- fmt.Errorf("tenant %s counted %d rows of others (%v)", tenant, n, err)
					return
				}
				err := gt.Transaction(func(tx *gorm.DB) error {
					var s string
					if err := tx.Raw("select current_setting('app.tenant_id', true)").Scan(&s).Error; err != nil {
						return err
					}
					if s != tenant {
						return fmt.Errorf("a transaction of %s sees setting %q", tenant, s)
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assertReleased(t, p, "a")
	assertReleased(t, p, "b")
}
