package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// DBTX is the interface sqlc generates for pgx/v5; a Pool must satisfy it to
// replace a pgxpool.Pool in generated code.
type DBTX interface {
	Exec(context.Context, string, ...interface{}) (pgconn.CommandTag, error)
	Query(context.Context, string, ...interface{}) (pgx.Rows, error)
	QueryRow(context.Context, string, ...interface{}) pgx.Row
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}

var _ DBTX = (*tenantdb.Pool)(nil)

func inUse(p *tenantdb.Pool, tenant string) int { return p.TenantStat(tenant).InUse }

func assertInUse(t *testing.T, p *tenantdb.Pool, tenant string, want int, when string) {
	t.Helper()
	if got := inUse(p, tenant); got != want {
		t.Fatalf("%s: %s holds %d slots, want %d", when, tenant, got, want)
	}
	// pgxpool destroys a broken connection in the background, so its count
	// may lag the tenant slot by a moment.
	eventually(t, fmt.Sprintf("%s: %d shared connections acquired", when, want), func() bool {
		return int(p.Stat().AcquiredConns()) == want
	})
}

func TestSlotLifetimes(t *testing.T) {
	p := newPool(t, sharedPG, 4, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 2}}})
	ctx := as("acme")

	t.Run("Exec", func(t *testing.T) {
		if _, err := p.Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
		assertInUse(t, p, "acme", 0, "after Exec")
		if _, err := p.Exec(ctx, "select nonsense from nowhere"); err == nil {
			t.Fatal("bad SQL succeeded")
		}
		assertInUse(t, p, "acme", 0, "after a failed Exec")
	})
	t.Run("Query read to the end", func(t *testing.T) {
		rows, err := p.Query(ctx, "select generate_series(1, 3)")
		if err != nil {
			t.Fatal(err)
		}
		assertInUse(t, p, "acme", 1, "unclosed rows")
		n := 0
		for rows.Next() {
			n++
		}
		if n != 3 || rows.Err() != nil {
			t.Fatalf("read %d rows, err %v", n, rows.Err())
		}
		assertInUse(t, p, "acme", 0, "rows read to the end, not closed")
		rows.Close()
		assertInUse(t, p, "acme", 0, "closed twice")
	})
	t.Run("Query closed early", func(t *testing.T) {
		rows, err := p.Query(ctx, "select generate_series(1, 1000)")
		if err != nil {
			t.Fatal(err)
		}
		rows.Next()
		assertInUse(t, p, "acme", 1, "rows half read")
		rows.Close()
		assertInUse(t, p, "acme", 0, "rows closed")
	})
	t.Run("Query error", func(t *testing.T) {
		if _, err := p.Query(ctx, "select nonsense from nowhere"); err == nil {
			t.Fatal("bad SQL succeeded")
		}
		assertInUse(t, p, "acme", 0, "after a failed Query")
	})
	t.Run("CollectRows", func(t *testing.T) {
		rows, _ := p.Query(ctx, "select generate_series(1, 5)")
		got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil || len(got) != 5 {
			t.Fatal(got, err)
		}
		assertInUse(t, p, "acme", 0, "after CollectRows")
	})
	t.Run("QueryRow", func(t *testing.T) {
		row := p.QueryRow(ctx, "select 42")
		assertInUse(t, p, "acme", 1, "row not scanned")
		var n int
		if err := row.Scan(&n); err != nil || n != 42 {
			t.Fatal(n, err)
		}
		assertInUse(t, p, "acme", 0, "row scanned")
	})
	t.Run("Tx commit", func(t *testing.T) {
		tx, err := p.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
		assertInUse(t, p, "acme", 1, "open transaction")
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		assertInUse(t, p, "acme", 0, "committed")
		if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("rollback after commit: %v", err)
		}
		assertInUse(t, p, "acme", 0, "rolled back after commit")
	})
	t.Run("Tx rollback", func(t *testing.T) {
		tx, err := p.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
		if err != nil {
			t.Fatal(err)
		}
		assertInUse(t, p, "acme", 1, "open transaction")
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		assertInUse(t, p, "acme", 0, "rolled back")
	})
	t.Run("BeginFunc panics", func(t *testing.T) {
		func() {
			defer func() { recover() }()
			_ = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error { panic("boom") })
		}()
		assertInUse(t, p, "acme", 0, "after a panic in BeginFunc")
	})
	t.Run("AcquireFunc panics", func(t *testing.T) {
		func() {
			defer func() { recover() }()
			_ = p.AcquireFunc(ctx, func(c tenantdb.Conn) error {
				if _, err := c.Exec(ctx, "select 1"); err != nil {
					return err
				}
				panic("boom")
			})
		}()
		assertInUse(t, p, "acme", 0, "after a panic in AcquireFunc")
	})
	t.Run("Acquire", func(t *testing.T) {
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := c.QueryRow(ctx, "select 7").Scan(&n); err != nil || n != 7 {
			t.Fatal(n, err)
		}
		assertInUse(t, p, "acme", 1, "acquired conn")
		c.Release()
		c.Release()
		assertInUse(t, p, "acme", 0, "released twice")
	})
	t.Run("SendBatch", func(t *testing.T) {
		b := &pgx.Batch{}
		b.Queue("select 1")
		b.Queue("select 2")
		br := p.SendBatch(ctx, b)
		assertInUse(t, p, "acme", 1, "batch open")
		if _, err := br.Exec(); err != nil {
			t.Fatal(err)
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
		assertInUse(t, p, "acme", 0, "batch closed")
	})
	t.Run("SendBatch with BeginTx", func(t *testing.T) {
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		b.Queue("select 1")
		br := p.SendBatch(ctx, b)
		tx := br.Tx()
		if tx == nil {
			t.Fatal("no transaction from a batch that began one")
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
		assertInUse(t, p, "acme", 1, "batch closed, its transaction open")
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		assertInUse(t, p, "acme", 0, "batch transaction committed")
	})
	t.Run("CopyFrom", func(t *testing.T) {
		if _, err := p.Exec(ctx, "create table if not exists copy_target(n int)"); err != nil {
			t.Fatal(err)
		}
		n, err := p.CopyFrom(ctx, pgx.Identifier{"copy_target"}, []string{"n"}, pgx.CopyFromRows([][]any{{1}, {2}, {3}}))
		if err != nil || n != 3 {
			t.Fatal(n, err)
		}
		assertInUse(t, p, "acme", 0, "after CopyFrom")
	})
	t.Run("Ping", func(t *testing.T) {
		if err := p.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		assertInUse(t, p, "acme", 0, "after Ping")
	})
	assertNothingHeld(t, p)
}
