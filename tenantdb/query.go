package tenantdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// Exec runs sql for the tenant in ctx, holding its slot until Exec returns.
// ctx governs the tenant wait, the wait for a connection and the query.
func (p *Pool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	permit, err := p.admit(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer permit.Release()
	if gctx, g := guardRevocation(ctx, permit); g != nil {
		return p.execGuarded(gctx, g, sql, args)
	}
	return p.pg.Exec(ctx, sql, args...)
}

// execGuarded is Exec under a revocable cluster lease: it acquires the
// connection itself, so that a revocation can cancel the statement on it.
func (p *Pool) execGuarded(ctx context.Context, g *revokeGuard, sql string, args []any) (_ pgconn.CommandTag, err error) {
	c, err := p.pg.Acquire(ctx)
	if err != nil {
		g.stop()
		return pgconn.CommandTag{}, g.wrap(err)
	}
	g.attach(c)
	defer releaseGuarded(g, c, &err) // also if an argument's encoder panics
	return c.Exec(ctx, sql, args...)
}

// releaseGuarded stops g, returns c to pgxpool and makes *err match
// ErrRevoked if the revocation stopped the work: in that order, so that a
// CancelRequest in flight cannot reach the connection's next user. Run
// deferred, it returns the connection on a panic too (an argument's Valuer,
// a Scanner), as pgxpool's own Exec and Row.Scan do.
func releaseGuarded(g *revokeGuard, c *pgxpool.Conn, err *error) {
	g.stop()
	c.Release()
	*err = g.wrap(*err)
}

// Query runs sql for the tenant in ctx. The tenant's slot is held, with the
// connection, until the rows are closed or read to the end.
func (p *Pool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	permit, err := p.admit(ctx)
	if err != nil {
		return errRows{err}, err
	}
	if gctx, g := guardRevocation(ctx, permit); g != nil {
		c, err := p.pg.Acquire(gctx)
		if err != nil {
			g.stop()
			permit.Release()
			err = g.wrap(err)
			return errRows{err}, err
		}
		g.attach(c)
		rows, err := c.Query(gctx, sql, args...)
		r := &tenantRows{Rows: rows, permit: permit, g: g, conn: c}
		if err != nil {
			r.Close()
			err = g.wrap(err)
			return errRows{err}, err
		}
		return r, nil
	}
	rows, err := p.pg.Query(ctx, sql, args...)
	if err != nil {
		permit.Release() // pgxpool has released the connection
		return rows, err
	}
	return &tenantRows{Rows: rows, permit: permit}, nil
}

// tenantRows returns the slot when pgxpool returns the connection: on Close,
// or when Next reports the end. Under a revocable cluster lease it holds the
// connection itself (conn) and its revocation guard.
type tenantRows struct {
	pgx.Rows
	permit pool.Permit
	g      *revokeGuard
	conn   *pgxpool.Conn
}

func (r *tenantRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.release()
	return false
}

func (r *tenantRows) Close() {
	r.Rows.Close()
	r.release()
}

func (r *tenantRows) Err() error { return r.g.wrap(r.Rows.Err()) }

// release returns the connection (after the guard stopped) and the slot.
func (r *tenantRows) release() {
	r.g.stop()
	if r.conn != nil {
		r.conn.Release() // idempotent
	}
	r.permit.Release()
}

// QueryRow runs sql for the tenant in ctx. The slot is held until Scan.
func (p *Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	permit, err := p.admit(ctx)
	if err != nil {
		return errRow{err}
	}
	if gctx, g := guardRevocation(ctx, permit); g != nil {
		c, err := p.pg.Acquire(gctx)
		if err != nil {
			g.stop()
			permit.Release()
			return errRow{g.wrap(err)}
		}
		g.attach(c)
		return &tenantRow{row: c.QueryRow(gctx, sql, args...), permit: permit, g: g, conn: c}
	}
	return &tenantRow{row: p.pg.QueryRow(ctx, sql, args...), permit: permit}
}

type tenantRow struct {
	row    pgx.Row
	permit pool.Permit
	g      *revokeGuard  // nil without a revocable cluster lease
	conn   *pgxpool.Conn // set with g
}

func (r *tenantRow) Scan(dest ...any) (err error) {
	defer r.permit.Release()
	if r.conn != nil {
		defer releaseGuarded(r.g, r.conn, &err) // also if a Scanner panics
	}
	return r.row.Scan(dest...)
}

// SendBatch sends b for the tenant in ctx. The slot is held, with the
// connection, until the results are closed; or, when the batch begins a
// transaction (pgx.Batch.BeginTx), until that transaction is committed or
// rolled back.
func (p *Pool) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	permit, err := p.admit(ctx)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if gctx, g := guardRevocation(ctx, permit); g != nil {
		c, err := p.pg.Acquire(gctx)
		if err != nil {
			g.stop()
			permit.Release()
			return pgx.FailedBatchResults(b, g.wrap(err))
		}
		g.attach(c)
		br := c.SendBatch(gctx, b)
		if tx := br.Tx(); tx != nil {
			return &tenantBatchResults{BatchResults: br, tx: &tenantTx{Tx: tx, permit: permit, g: g, conn: c}}
		}
		return &tenantBatchResults{BatchResults: br, permit: permit, g: g, conn: c}
	}
	br := p.pg.SendBatch(ctx, b)
	if tx := br.Tx(); tx != nil {
		return &tenantBatchResults{BatchResults: br, tx: &tenantTx{Tx: tx, permit: permit}}
	}
	return &tenantBatchResults{BatchResults: br, permit: permit}
}

type tenantBatchResults struct {
	pgx.BatchResults
	permit pool.Permit // zero when tx owns it
	tx     *tenantTx
	g      *revokeGuard  // nil without a revocable cluster lease, or when tx owns it
	conn   *pgxpool.Conn // set with g
}

func (b *tenantBatchResults) Close() error {
	err := b.BatchResults.Close()
	err = b.g.wrap(err)
	b.g.stop()
	if b.conn != nil {
		b.conn.Release()
	}
	b.permit.Release()
	if b.tx != nil && b.tx.Conn() == nil {
		// The batch never got a connection (pgxpool failed to acquire one):
		// its transaction holds nothing, so neither does the tenant.
		b.tx.release()
	}
	return err
}

func (b *tenantBatchResults) Tx() pgx.Tx {
	if b.tx == nil {
		return nil
	}
	return b.tx
}

// CopyFrom copies rows into tableName for the tenant in ctx, holding its slot
// until it returns.
func (p *Pool) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (_ int64, err error) {
	permit, err := p.admit(ctx)
	if err != nil {
		return 0, err
	}
	defer permit.Release()
	gctx, g := guardRevocation(ctx, permit)
	if g == nil {
		return p.pg.CopyFrom(ctx, tableName, columnNames, rowSrc)
	}
	c, err := p.pg.Acquire(gctx)
	if err != nil {
		g.stop()
		return 0, g.wrap(err)
	}
	g.attach(c)
	defer releaseGuarded(g, c, &err)
	return c.CopyFrom(gctx, tableName, columnNames, rowSrc)
}

// errRows and errRow carry an admission error the way
// pgxpool's own do for an acquire error.
type errRows struct{ err error }

func (errRows) Close()                                       {}
func (e errRows) Err() error                                 { return e.err }
func (errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (errRows) Next() bool                                   { return false }
func (e errRows) Scan(...any) error                          { return e.err }
func (e errRows) Values() ([]any, error)                     { return nil, e.err }
func (e errRows) RawValues() [][]byte                        { return nil }
func (e errRows) Conn() *pgx.Conn                            { return nil }
func (e errRows) TypeMap() *pgtype.Map                       { return nil }

type errRow struct{ err error }

func (e errRow) Scan(...any) error { return e.err }
