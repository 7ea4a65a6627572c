package tenantsql_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// bunDoc is a row of setupRLS's docs table for bun.
type bunDoc struct {
	bun.BaseModel `bun:"table:docs"`

	ID     int64  `bun:",pk,autoincrement"`
	Tenant string `bun:",nullzero,default:current_setting('app.tenant_id', true)"`
	Body   string
}

// TestBun runs a tenant's queries through bun on OpenDB: selects see only
// the tenant's rows under row-level security, an insert in RunInTx holds one
// slot and is the tenant's, and nothing stays held.
func TestBun(t *testing.T) {
	dsn := setupRLS(t)
	p := newPool(t, dsn, 2, tenantdb.Plan{MaxConns: 1}, rlsSession)
	db := bun.NewDB(openDB(t, p), pgdialect.New())

	for tenant, want := range map[string][]string{"a": {"a1", "a2"}, "b": {"b1"}} {
		var docs []bunDoc
		if err := db.NewSelect().Model(&docs).Order("body").Scan(as(tenant)); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range docs {
			got = append(got, d.Body)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("bun select as %s: %v; want %v", tenant, got, want)
		}
		assertReleased(t, p, tenant)
	}

	err := db.RunInTx(as("b"), nil, func(ctx context.Context, tx bun.Tx) error {
		doc := &bunDoc{Body: "b2"}
		if _, err := tx.NewInsert().Model(doc).Returning("tenant").Exec(ctx); err != nil {
			return err
		}
		if doc.Tenant != "b" {
			t.Errorf("bun insert as b made a row of tenant %q", doc.Tenant)
		}
		if n := inUse(p, "b"); n != 1 {
			t.Errorf("a bun transaction holds %d slots; want 1", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	assertReleased(t, p, "b")
	n, err := db.NewSelect().Model((*bunDoc)(nil)).Count(as("a"))
	if err != nil || n != 2 {
		t.Fatalf("tenant a counts %d rows after b's insert (%v); want 2", n, err)
	}
	if _, err := db.NewSelect().Model((*bunDoc)(nil)).Count(context.Background()); !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("bun without a tenant: %v; want ErrNoTenant", err)
	}
	assertReleased(t, p, "a")
}
