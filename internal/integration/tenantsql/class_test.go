package tenantsql_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestClassFromContext: a statement's class comes from its context, as with
// the pgx API: acme's one batch slot is taken by an open Rows of class
// batch, a second batch statement is refused naming the class, and a
// default-class statement still runs.
func TestClassFromContext(t *testing.T) {
	pcfg, err := pgxpool.ParseConfig(sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 4
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 3}},
		Classes: map[string]tenantdb.Class{"batch": {MaxConns: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	db := openDB(t, p)
	batch := tenantdb.WithClass(as("acme"), "batch")
	rows, err := db.QueryContext(batch, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.ExecContext(batch, "select 1")
	var ole *tenantdb.OverLimitError
	if !errors.As(err, &ole) || ole.Class != "batch" || ole.Limit != 1 {
		t.Fatalf("a second batch statement: err = %v, want an OverLimitError of class batch at its cap 1", err)
	}
	if _, err := db.ExecContext(as("acme"), "select 1"); err != nil {
		t.Fatalf("a default-class statement beside the batch one: %v", err)
	}
	if _, err := db.ExecContext(tenantdb.WithClass(as("acme"), "nope"), "select 1"); !errors.Is(err, tenantdb.ErrUnknownClass) {
		t.Fatalf("an unknown class: err = %v", err)
	}
	rows.Close()
	if s := p.TenantStat("acme"); len(s.Classes) != 2 || s.Classes[1].Acquired != 1 || s.Classes[1].Rejected != 1 {
		t.Fatalf("per-class stats: %+v", s.Classes)
	}
	assertReleased(t, p, "acme")
}
