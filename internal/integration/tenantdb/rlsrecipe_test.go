package tenantdb_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/internal/doctest"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// rlsRecipe is the heading of the documented recipe that TestRLSRecipe runs.
const rlsRecipe = "## A complete recipe: row-level security for reads and writes"

// TestRLSRecipe runs the row-level security recipe of docs/session-state.md
// as a user would: its SQL as the superuser on a fresh database, its program
// as it stands in the docs, built and started as a service. Through the
// service, each tenant writes orders whose tenant comes from the setting and
// reads only its own, and a tenant without an account is refused (401). As
// the service's role, a write or update for another tenant fails, updates and
// deletes of others' rows change nothing, and work without a tenant sees
// nothing and cannot insert. The service stops gracefully on SIGTERM.
//
// It runs the program twice, as it stands: directly, and through PgBouncer
// in transaction mode with BEHIND_POOLER set, with a small server pool and
// tenants looked up at once, so that a statement that relies on its server
// connection's session (a cached prepared statement in Lookup's pool) meets
// another connection.
func TestRLSRecipe(t *testing.T) {
	section := doctest.Section(t, rlsRecipe)
	sqlBlocks := doctest.Blocks(t, section, "sql")
	if len(sqlBlocks) != 1 {
		t.Fatalf("the recipe has %d SQL blocks, want 1", len(sqlBlocks))
	}
	exe := doctest.BuildExecutable(t, rlsRecipe, "tenantdb/internal/rlsrecipe")
	t.Run("direct", func(t *testing.T) { runRLSRecipe(t, exe, sqlBlocks[0], false) })
	t.Run("behind PgBouncer", func(t *testing.T) { runRLSRecipe(t, exe, sqlBlocks[0], true) })
}

func runRLSRecipe(t *testing.T, exe, recipeSQL string, behindPooler bool) {
	ctx := context.Background()
	superDSN, appDSN := recipeDatabase(t, recipeSQL)
	serviceDSN, env := appDSN, []string(nil)
	if behindPooler {
		serviceDSN, env = recipeBouncer(t, superDSN), []string{"BEHIND_POOLER=1"}
	}

	addr := freeAddr(t)
	var logs bytes.Buffer
	cmd := exec.Command(exe)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL="+serviceDSN, "ADDR="+addr), env...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	call := func(method, tenant, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+"/orders", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Tenant", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s /orders as %s: %v\nservice output:\n%s", method, tenant, err, logs.String())
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	eventually(t, "the recipe's service answers", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("the recipe's service exited: %v\n%s", err, logs.String())
		default:
		}
		resp, err := http.Get("http://" + addr + "/orders")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})

	for _, o := range []struct {
		tenant string
		total  string
	}{{"acme", "10.5"}, {"globex", "7"}, {"acme", "20"}} {
		if code, body := call("POST", o.tenant, `{"total": `+o.total+`}`); code != http.StatusCreated {
			t.Fatalf("POST an order as %s: %d %s\n%s", o.tenant, code, body, logs.String())
		}
	}
	totals := func(tenant string) []float64 {
		t.Helper()
		code, body := call("GET", tenant, "")
		if code != http.StatusOK {
			t.Fatalf("GET /orders as %s: %d %s", tenant, code, body)
		}
		var orders []struct{ Total float64 }
		if err := json.Unmarshal([]byte(body), &orders); err != nil {
			t.Fatalf("GET /orders as %s: %v: %s", tenant, err, body)
		}
		var out []float64
		for _, o := range orders {
			out = append(out, o.Total)
		}
		return out
	}
	if got := totals("acme"); !slices.Equal(got, []float64{10.5, 20}) {
		t.Errorf("acme reads orders %v, want [10.5 20]", got)
	}
	if got := totals("globex"); !slices.Equal(got, []float64{7}) {
		t.Errorf("globex reads orders %v, want [7]", got)
	}
	// Ten more accounts, looked up at once with the orders read beside them:
	// Lookup's pool and the tenants' share PgBouncer's three server
	// connections.
	super0, err := pgx.Connect(ctx, superDSN)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := super0.Exec(ctx, "insert into tenants select 'extra' || i, 'free' from generate_series(1, 10) i"); err != nil {
		t.Fatal(err)
	}
	super0.Close(ctx)
	codes := make(chan string, 30)
	for i := range 30 {
		go func() {
			tenant := fmt.Sprintf("extra%d", i%10+1)
			req, _ := http.NewRequest("GET", "http://"+addr+"/orders", nil)
			req.Header.Set("X-Tenant", tenant)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- err.Error()
				return
			}
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			codes <- fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(b.String()))
		}()
	}
	for range 30 {
		// 429 is a free plan's cap of 2 doing its work; anything else is a failure.
		if c := <-codes; !strings.HasPrefix(c, "200 ") && !strings.HasPrefix(c, "429 ") {
			t.Errorf("GET /orders as a new tenant: %s\n%s", c, logs.String())
		}
	}
	for range 20 { // a flood of an unknown tenant: refused every time
		for _, method := range []string{"GET", "POST"} {
			if code, body := call(method, "ghost", `{"total": 1}`); code != http.StatusUnauthorized {
				t.Fatalf("%s as a tenant without an account: %d %s, want 401", method, code, body)
			}
		}
	}

	// The rows carry the tenant the setting gave them.
	super, err := pgx.Connect(ctx, superDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer super.Close(ctx)
	var owners string
	if err := super.QueryRow(ctx, "select string_agg(tenant_id, ',' order by id) from orders").Scan(&owners); err != nil || owners != "acme,globex,acme" {
		t.Errorf("the orders' tenants: %q, %v; want acme,globex,acme", owners, err)
	}

	// As the service's role, with acme's setting: nothing of globex's can be
	// written, changed or removed.
	app, err := pgx.Connect(ctx, appDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	wantCode := func(what, code string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != code {
			t.Errorf("%s: %v, want SQLSTATE %s", what, err, code)
		}
	}
	_, err = app.Exec(ctx, "insert into orders (total) values (1)")
	wantCode("an insert without a tenant", "42704", err) // unrecognized configuration parameter
	var n int
	if err := app.QueryRow(ctx, "select count(*) from orders").Scan(&n); err != nil || n != 0 {
		t.Errorf("a read without a tenant: %d rows, %v; want 0", n, err)
	}
	if _, err := app.Exec(ctx, "select set_config('app.tenant_id', '', false)"); err != nil {
		t.Fatal(err)
	}
	_, err = app.Exec(ctx, "insert into orders (total) values (1)")
	wantCode("an insert with an empty tenant", "23514", err) // the check constraint
	if err := app.QueryRow(ctx, "select count(*) from orders").Scan(&n); err != nil || n != 0 {
		t.Errorf("a read with an empty tenant: %d rows, %v; want 0", n, err)
	}
	if _, err := app.Exec(ctx, "select set_config('app.tenant_id', 'acme', false)"); err != nil {
		t.Fatal(err)
	}
	_, err = app.Exec(ctx, "insert into orders (tenant_id, total) values ('globex', 1)")
	wantCode("acme inserting a row of globex", "42501", err)
	_, err = app.Exec(ctx, "update orders set tenant_id = 'globex'")
	wantCode("acme moving its rows to globex", "42501", err)
	for _, sql := range []string{"update orders set total = 0 where tenant_id = 'globex'", "delete from orders where tenant_id = 'globex'"} {
		if tag, err := app.Exec(ctx, sql); err != nil || tag.RowsAffected() != 0 {
			t.Errorf("as acme, %s: %d rows, %v; want 0", sql, tag.RowsAffected(), err)
		}
	}
	if tag, err := app.Exec(ctx, "update orders set total = total + 1"); err != nil || tag.RowsAffected() != 2 {
		t.Errorf("acme updating its own rows: %d rows, %v; want 2", tag.RowsAffected(), err)
	}
	if err := super.QueryRow(ctx, "select count(*) from orders where tenant_id = 'globex' and total = 7").Scan(&n); err != nil || n != 1 {
		t.Errorf("globex's order after acme's attempts: %d unchanged, %v; want 1", n, err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if err := <-exited; err != nil {
		t.Errorf("the service did not stop gracefully on SIGTERM: %v\n%s", err, logs.String())
	}
}

// recipeDatabase creates a fresh database rls_recipe (and drops the
// recipe's roles, which are the cluster's), runs the recipe's SQL in it as
// the superuser, and returns the superuser's DSN and the app role's for it.
func recipeDatabase(t *testing.T, recipeSQL string) (superDSN, appDSN string) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, sql := range []string{
		"drop database if exists rls_recipe with (force)",
		"drop role if exists app",
		"drop role if exists app_owner",
		"create database rls_recipe",
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	u, err := url.Parse(sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/rls_recipe"
	superDSN = u.String()
	db, err := pgx.Connect(ctx, superDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	if _, err := db.Exec(ctx, recipeSQL); err != nil {
		t.Fatalf("the recipe's SQL: %v", err)
	}
	u.User = url.UserPassword("app", "change-me")
	return superDSN, u.String()
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr())
}

// recipeBouncer starts PgBouncer in transaction mode, with a server pool
// of 3, in front of the recipe's database, and returns the app role's DSN
// through it.
func recipeBouncer(t *testing.T, superDSN string) string {
	t.Helper()
	u, err := url.Parse(superDSN)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	bouncer := tenantdbtest.StartPgBouncer(t, &tenantdbtest.Postgres{DSN: superDSN, Addr: u.Host,
		User: u.User.Username(), Password: password, Database: "rls_recipe"},
		tenantdbtest.WithPoolMode(tenantdbtest.PoolModeTransaction), tenantdbtest.WithPoolSize(3),
		tenantdbtest.WithPgBouncerUser("app", "change-me"))
	return bouncer.DSNFor("app", "change-me")
}

// TestRLSBulkImport runs the bulk import program of docs/session-state.md
// as it stands against the recipe's database: as the app role, COPY
// straight into orders is refused (0A000), which is why the program copies
// into a temporary table; the program imports acme's rows directly and
// globex's through PgBouncer in transaction mode, and each lands with its
// tenant, none of the other's.
func TestRLSBulkImport(t *testing.T) {
	ctx := context.Background()
	sqlBlocks := doctest.Blocks(t, doctest.Section(t, rlsRecipe), "sql")
	superDSN, appDSN := recipeDatabase(t, sqlBlocks[0])
	exe := doctest.BuildExecutable(t, "## Bulk import into a table under row-level security", "tenantdb/internal/rlsimport")

	app, err := pgx.Connect(ctx, appDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	if _, err := app.Exec(ctx, "select set_config('app.tenant_id', 'acme', false)"); err != nil {
		t.Fatal(err)
	}
	_, err = app.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"total"}, pgx.CopyFromRows([][]any{{1.5}}))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "0A000" {
		t.Fatalf("COPY into orders under RLS: %v, want SQLSTATE 0A000", err)
	}

	run := func(dsn, tenant, rows string, env ...string) {
		t.Helper()
		cmd := exec.Command(exe)
		cmd.Env = append(append(os.Environ(), "DATABASE_URL="+dsn, "TENANT="+tenant, "ROWS="+rows), env...)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != rows {
			t.Fatalf("importing %s rows for %s: %v\n%s", rows, tenant, err, out)
		}
	}
	run(appDSN, "acme", "5000")
	run(recipeBouncer(t, superDSN), "globex", "3000", "BEHIND_POOLER=1")

	super, err := pgx.Connect(ctx, superDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer super.Close(ctx)
	var got string
	if err := super.QueryRow(ctx, "select string_agg(tenant_id || '=' || n, ',' order by tenant_id) from "+
		"(select tenant_id, count(*) n from orders group by tenant_id) c").Scan(&got); err != nil || got != "acme=5000,globex=3000" {
		t.Errorf("orders by tenant: %q, %v; want acme=5000,globex=3000", got, err)
	}
}
