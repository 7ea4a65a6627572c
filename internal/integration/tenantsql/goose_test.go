package tenantsql_test

import (
	"context"
	"errors"
	"testing"
	"testing/fstest"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestGooseMigrations runs goose migrations, with goose's session lock,
// through OpenDB as a system tenant capped at one connection: they apply in
// order, the tenant's admissions count them, they hold nothing afterwards,
// and without a tenant goose fails with ErrNoTenant.
func TestGooseMigrations(t *testing.T) {
	p := newPool(t, "", 2, tenantdb.Plan{MaxConns: 1}, tenantdb.Session{})
	db := openDB(t, p)
	fsys := fstest.MapFS{
		"00001_create_goose_items.sql": {Data: []byte(`-- +goose Up
create table goose_items (id bigserial primary key, name text not null);
-- +goose Down
drop table goose_items;
`)},
		"00002_seed_goose_items.sql": {Data: []byte(`-- +goose Up
insert into goose_items (name) values ('first');
-- +goose Down
delete from goose_items;
`)},
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		t.Fatal(err)
	}
	newProvider := func() *goose.Provider {
		provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithSessionLocker(locker))
		if err != nil {
			t.Fatal(err)
		}
		return provider
	}

	if _, err := newProvider().Up(context.Background()); !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("goose Up without a tenant: %v; want ErrNoTenant", err)
	}
	provider := newProvider()
	system := as("system")
	results, err := provider.Up(system)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("goose applied %d migrations; want 2", len(results))
	}
	assertReleased(t, p, "system")
	if s := p.TenantStat("system"); s.Acquired == 0 {
		t.Fatal("the migrations took none of the system tenant's slots")
	}
	version, err := provider.GetDBVersion(system)
	if err != nil || version != 2 {
		t.Fatalf("goose version %d (%v); want 2", version, err)
	}
	var name string
	if err := db.QueryRowContext(system, "select name from goose_items").Scan(&name); err != nil || name != "first" {
		t.Fatalf("the migrated table holds %q (%v); want first", name, err)
	}
	if _, err := provider.DownTo(system, 0); err != nil {
		t.Fatal(err)
	}
	assertReleased(t, p, "system")
}
