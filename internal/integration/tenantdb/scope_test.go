package tenantdb_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// newScopedRLSPool is newRLSPool with the given Session scope.
// Under ScopeTransaction its statements run in pgx.QueryExecModeExec, as a
// SearchPath there requires.
func newScopedRLSPool(t *testing.T, dsn string, maxConns int32, scope tenantdb.Scope, searchPath func(string) []string) *tenantdb.Pool {
	t.Helper()
	if searchPath == nil {
		searchPath = func(id string) []string { return []string{"tenant_" + id, "public"} }
	}
	pcfg := pgxConfig(t, sharedPG, maxConns)
	app, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.User, pcfg.ConnConfig.Password = app.User, app.Password
	if scope == tenantdb.ScopeTransaction {
		pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}},
		Session: tenantdb.Session{
			TenantSetting: "app.tenant_id",
			SearchPath:    searchPath,
			Scope:         scope,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestScopeTransactionSetsEveryStatement: with ScopeTransaction, every way
// the Pool and a Conn run a statement sees its tenant's rows and schema,
// and the connection's session carries neither afterwards, so nothing
// depends on which server connection runs the next statement.
func TestScopeTransactionSetsEveryStatement(t *testing.T) {
	p := newScopedRLSPool(t, setupRLS(t), 1, tenantdb.ScopeTransaction, nil)
	for range 2 {
		for _, tenant := range []string{"a", "b"} {
			readAs(t, p, tenant)
			ctx := as(tenant)
			// Several statements without arguments share the setting.
			if _, err := p.Exec(ctx, "insert into uploads values ('from "+tenant+"'); insert into uploads values ('from "+tenant+"')"); err != nil {
				t.Fatalf("multi-statement Exec as %s: %v", tenant, err)
			}
			// Arguments take the batch path.
			var n int
			if _, err := p.Exec(ctx, "insert into uploads select $1::text", "from "+tenant); err != nil {
				t.Fatal(err)
			}
			if err := p.QueryRow(ctx, "select count(*) from rls_docs where body like $1", tenant+"%").Scan(&n); err != nil || n != len(wantProbe[tenant].tenants) {
				t.Fatalf("QueryRow with an argument as %s: %d rows, %v", tenant, n, err)
			}
			// A batch that begins a transaction keeps the setting in it.
			b := &pgx.Batch{}
			b.BeginTx(pgx.TxOptions{})
			b.Queue("select count(*) from rls_docs")
			br := p.SendBatch(ctx, b)
			if _, err := br.Exec(); err != nil {
				t.Fatalf("BEGIN in a batch as %s: %v", tenant, err)
			}
			if err := br.QueryRow().Scan(&n); err != nil || n != len(wantProbe[tenant].tenants) {
				t.Fatalf("batch with BeginTx as %s: %d rows, %v", tenant, n, err)
			}
			if err := br.Close(); err != nil {
				t.Fatal(err)
			}
			tx := br.Tx()
			if err := tx.QueryRow(ctx, "select count(*) from rls_docs").Scan(&n); err != nil || n != len(wantProbe[tenant].tenants) {
				t.Fatalf("the batch's transaction as %s: %d rows, %v", tenant, n, err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			// The session itself holds nothing.
			err := p.AcquireFunc(ctx, func(c tenantdb.Conn) error {
				var setting, path string
				err := c.Conn().QueryRow(ctx, "select current_setting('app.tenant_id', true), current_setting('search_path')").Scan(&setting, &path)
				if err == nil && (setting != "" || strings.Contains(path, "tenant_")) {
					t.Errorf("the session carries app.tenant_id %q and search_path %q", setting, path)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			assertNothingHeld(t, p)
		}
	}
	checkUploads(t, map[string]int{"a": 8, "b": 8})
}

// TestSessionSettingNames: New accepts the custom setting names PostgreSQL
// accepts and refuses the others with ErrInvalidConfig, instead of failing
// every call later.
func TestSessionSettingNames(t *testing.T) {
	good := []string{"app.tenant_id", "a.b.c", "App.X$1", "_x._y", "app.t9"}
	bad := []string{"tenant_id", "app.", ".tenant", "app..x", "app.1x", "$app.x", "app.$x", "app.tenant-id",
		"app.tenant id", "1app.x", "app.x'; drop table t; --", "app." + strings.Repeat("x", 60)}
	for _, name := range good {
		p, err := tenantdb.New(context.Background(), pgxConfig(t, sharedPG, 2), tenantdb.Config{
			Session: tenantdb.Session{TenantSetting: name},
		})
		if err != nil {
			t.Errorf("TenantSetting %q: %v", name, err)
			continue
		}
		if _, err := p.Exec(as("acme"), "select current_setting($1)", name); err != nil {
			t.Errorf("TenantSetting %q accepted by New, refused by PostgreSQL: %v", name, err)
		}
		p.Close()
	}
	for _, name := range bad {
		_, err := tenantdb.New(context.Background(), pgxConfig(t, sharedPG, 2), tenantdb.Config{
			Session: tenantdb.Session{TenantSetting: name},
		})
		if !errors.Is(err, pool.ErrInvalidConfig) {
			t.Errorf("TenantSetting %q: err = %v, want ErrInvalidConfig", name, err)
		}
	}
	_, err := tenantdb.New(context.Background(), pgxConfig(t, sharedPG, 2), tenantdb.Config{
		Session: tenantdb.Session{TenantSetting: "app.tenant_id", Scope: 7},
	})
	if !errors.Is(err, pool.ErrInvalidConfig) {
		t.Errorf("Scope 7: err = %v, want ErrInvalidConfig", err)
	}
	// The cached modes parse a statement before ScopeTransaction's role
	// and search_path are pinned, and a transaction pooler does not carry
	// their prepared statements: refused with or without a SearchPath.
	for _, s := range []tenantdb.Session{
		{SearchPath: func(string) []string { return nil }, Scope: tenantdb.ScopeTransaction},
		{TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction},
	} {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec} {
			pcfg := pgxConfig(t, sharedPG, 2)
			pcfg.ConnConfig.DefaultQueryExecMode = mode
			_, err = tenantdb.New(context.Background(), pcfg, tenantdb.Config{Session: s})
			if !errors.Is(err, pool.ErrInvalidConfig) || !strings.Contains(err.Error(), "QueryExecModeExec") {
				t.Errorf("ScopeTransaction (SearchPath %t) in %v: err = %v, want ErrInvalidConfig naming the mode", s.SearchPath != nil, mode, err)
			}
		}
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		pcfg := pgxConfig(t, sharedPG, 2)
		pcfg.ConnConfig.DefaultQueryExecMode = mode
		p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
			Session: tenantdb.Session{TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction},
		})
		if err != nil {
			t.Errorf("ScopeTransaction in %v: %v", mode, err)
			continue
		}
		p.Close()
	}
}

// TestSchemaNameLimits: a schema name PostgreSQL would truncate to 63 bytes
// (two tenants sharing their first bytes would share a schema) fails the
// call; a failed setup keeps the healthy connection it never touched.
func TestSchemaNameLimits(t *testing.T) {
	dsn := setupRLS(t)
	for _, scope := range []tenantdb.Scope{tenantdb.ScopeSession, tenantdb.ScopeTransaction} {
		p := newScopedRLSPool(t, dsn, 1, scope, func(id string) []string {
			switch id {
			case "long":
				return []string{"tenant_" + strings.Repeat("x", 57)} // 64 bytes
			case "panics":
				panic("no schema for this tenant")
			case "empty":
				return []string{""}
			case "temp":
				return []string{"pg_temp", "public"} // the session's temporary schema first
			}
			return []string{"tenant_" + id, "public"}
		})
		var pid, again int
		if err := p.QueryRow(as("a"), "select pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		for _, tenant := range []string{"long", "panics", "empty", "temp"} {
			var n int
			err := p.QueryRow(as(tenant), "select 1").Scan(&n)
			if err == nil {
				t.Fatalf("%s: the call succeeded without its session state", tenant)
			}
			if tenant == "long" && !strings.Contains(err.Error(), "truncates") {
				t.Errorf("long: err = %v, want one that says PostgreSQL truncates the name", err)
			}
			assertNothingHeld(t, p)
		}
		if err := p.QueryRow(as("a"), "select pg_backend_pid()").Scan(&again); err != nil {
			t.Fatal(err)
		}
		if again != pid {
			t.Errorf("the failed setups replaced the healthy connection (backend %d, then %d)", pid, again)
		}
		if total := p.Stat().TotalConns(); total != 1 {
			t.Errorf("%d shared connections, want the one", total)
		}
	}
}
