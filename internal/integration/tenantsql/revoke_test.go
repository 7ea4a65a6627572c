package tenantsql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/internal/integration/fakecluster"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestRevokedClusterSlot checks that when a tenant's cluster-wide slot is
// revoked, the statement running on its database/sql connection is
// cancelled in PostgreSQL with an error matching tenantdb.ErrRevoked, later
// statements on its sql.Conn are refused with it, and the slot goes back.
func TestRevokedClusterSlot(t *testing.T) {
	pcfg, err := pgxpool.ParseConfig(sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 2
	cluster := &fakecluster.Revoker{}
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 1}},
		Cluster: cluster,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	db := openDB(t, p)

	c, err := db.Conn(as("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.ExecContext(as("a"), "select pg_sleep(60)")
		done <- err
	}()
	admin, err := sql.Open("pgx", sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	eventually(t, "the sleep runs", func() bool {
		var n int
		err := admin.QueryRow("select count(*) from pg_stat_activity where query = 'select pg_sleep(60)' and state = 'active'").Scan(&n)
		return err == nil && n == 1
	})
	cluster.RevokeAll()
	err = <-done
	if !errors.Is(err, tenantdb.ErrRevoked) {
		t.Fatalf("the statement running when the slot was revoked: %v; want ErrRevoked", err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("the revoked statement's error %v is not PostgreSQL's query_canceled (57014)", err)
	}
	if _, err := c.ExecContext(as("a"), "select 1"); !errors.Is(err, tenantdb.ErrRevoked) {
		t.Fatalf("a statement on the Conn after the revocation: %v; want ErrRevoked", err)
	}
	c.Close()
	assertReleased(t, p, "a")
}
