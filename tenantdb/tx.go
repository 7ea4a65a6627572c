package tenantdb

import (
	"context"

	"github.com/jackc/pgx/v5"

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
	tx, err := p.pg.BeginTx(ctx, txOptions)
	if err != nil {
		permit.Release() // pgxpool has released the connection
		return nil, err
	}
	return &tenantTx{Tx: tx, permit: permit}, nil
}

// tenantTx returns the slot when pgxpool returns the connection: after Commit
// or Rollback, whether or not they succeed.
type tenantTx struct {
	pgx.Tx
	permit pool.Permit
}

func (tx *tenantTx) Commit(ctx context.Context) error {
	defer tx.permit.Release()
	return tx.Tx.Commit(ctx)
}

func (tx *tenantTx) Rollback(ctx context.Context) error {
	defer tx.permit.Release()
	return tx.Tx.Rollback(ctx)
}
