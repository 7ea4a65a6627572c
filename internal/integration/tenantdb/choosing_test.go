package tenantdb_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/internal/doctest"
	"github.com/tenantdb/tenantdb/internal/pgtest"
)

// TestChoosingProgram runs the program of docs/databases.md's "Choosing"
// section on a server prepared as the section says, as a role that row-level
// security applies to, and checks that every tenant sees its own rows only,
// under each of the three models.
func TestChoosingProgram(t *testing.T) {
	const heading = "## Choosing: row-level security, a schema or a database per tenant"
	blocks := doctest.GoBlocks(t, doctest.Section(t, heading))
	if len(blocks) == 0 || !strings.HasPrefix(blocks[0], "package main\n") {
		t.Fatalf("%q has no complete program", heading)
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	tenants := []string{"acme", "globex"}
	for _, tenant := range tenants {
		if _, err := admin.Exec(ctx, "drop database if exists t_"+tenant+" with (force)"); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, "create database t_"+tenant); err != nil {
			t.Fatal(err)
		}
	}
	dsn := pgtest.AppRole(t, sharedPG.DSN, "chooser", `
drop table if exists invoices;
create table invoices (tenant_id text, name text);
alter table invoices enable row level security;
create policy by_tenant on invoices using (tenant_id = current_setting('app.tenant_id', true));
insert into invoices values ('acme', 'acme-1'), ('globex', 'globex-1');
grant select on invoices to chooser;
drop schema if exists t_acme, t_globex cascade;
create schema t_acme;   create table t_acme.invoices (name text);   insert into t_acme.invoices values ('acme-1');
create schema t_globex; create table t_globex.invoices (name text); insert into t_globex.invoices values ('globex-1');
grant usage on schema t_acme, t_globex to chooser;
grant select on t_acme.invoices, t_globex.invoices to chooser;`)
	for _, tenant := range tenants {
		cfg, _ := pgx.ParseConfig(sharedPG.DSN)
		cfg.Database = "t_" + tenant
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Exec(ctx, "create table invoices (name text); insert into invoices values ('"+tenant+"-1'); grant select on invoices to chooser")
		c.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
	}

	root, dir := doctest.Root(t), t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte(blocks[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, "overlay.json")
	target := filepath.Join(root, "tenantdb", "internal", "choosing", "main.go")
	if err := os.WriteFile(overlay, []byte(`{"Replace":{"`+target+`":"`+src+`"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "-overlay="+overlay, "./tenantdb/internal/choosing")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off", "DATABASE_URL="+dsn)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the program failed: %v\n%s", err, out)
	}
	var want []string
	for _, model := range []string{"row-level security", "a schema per tenant", "a database per tenant"} {
		for _, tenant := range tenants {
			want = append(want, model+": "+tenant+" sees ["+tenant+"-1]")
		}
	}
	if got := strings.TrimSpace(string(out)); got != strings.Join(want, "\n") {
		t.Fatalf("the program printed:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}
