package tenantdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// Begin starts a transaction for the tenant in ctx. The tenant's slot is held,
// with the connection, until Commit or Rollback. pgx.BeginFunc works with a
// Pool and rolls back (releasing both) even when its function panics.
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error) {
	return p.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx starts a transaction with txOptions for the tenant in ctx, as Begin.
func (p *Pool) BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error) {
	permit, err := p.admit(ctx)
	if err != nil {
		return nil, err
	}
	if gctx, g := guardRevocation(ctx, permit); g != nil {
		c, err := p.pg.Acquire(gctx)
		if err != nil {
			g.stop()
			permit.Release()
			return nil, g.wrap(err)
		}
		g.attach(c)
		tx, err := c.BeginTx(gctx, txOptions)
		if err != nil {
			g.stop()
			c.Release()
			permit.Release()
			return nil, g.wrap(err)
		}
		return &tenantTx{Tx: tx, permit: permit, g: g, conn: c}, nil
	}
	tx, err := p.pg.BeginTx(ctx, txOptions)
	if err != nil {
		permit.Release() // pgxpool has released the connection
		return nil, err
	}
	return &tenantTx{Tx: tx, permit: permit}, nil
}

// tenantTx returns the slot when pgxpool returns the connection: after Commit
// or Rollback, whether or not they succeed.
//
// Under a revocable cluster lease it holds the connection itself (conn) and
// its revocation guard: a revocation cancels the statement running, and the
// transaction's later Exec, Query and QueryRow fail with ErrRevoked.
type tenantTx struct {
	pgx.Tx
	permit pool.Permit
	g      *revokeGuard  // nil without a revocable cluster lease
	conn   *pgxpool.Conn // set with g
}

func (tx *tenantTx) Commit(ctx context.Context) error {
	defer tx.release()
	return tx.g.wrap(tx.Tx.Commit(ctx))
}

func (tx *tenantTx) Rollback(ctx context.Context) error {
	defer tx.release()
	return tx.Tx.Rollback(ctx)
}

// release returns the connection (after the guard stopped) and the slot.
func (tx *tenantTx) release() {
	tx.g.stop()
	if tx.conn != nil {
		tx.conn.Release()
	}
	tx.permit.Release()
}

func (tx *tenantTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if tx.g.isRevoked() {
		return pgconn.CommandTag{}, ErrRevoked
	}
	tag, err := tx.Tx.Exec(ctx, sql, args...)
	return tag, tx.g.wrap(err)
}

func (tx *tenantTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if tx.g.isRevoked() {
		return errRows{ErrRevoked}, ErrRevoked
	}
	return tx.Tx.Query(ctx, sql, args...)
}

func (tx *tenantTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if tx.g.isRevoked() {
		return errRow{ErrRevoked}
	}
	return tx.Tx.QueryRow(ctx, sql, args...)
}
