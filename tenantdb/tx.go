package tenantdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Begin starts a transaction for the tenant in ctx. The tenant's slot is held,
// with the connection, until Commit or Rollback. pgx.BeginFunc works with a
// Pool and rolls back (releasing both) even when its function panics.
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error) {
	return p.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx starts a transaction with txOptions for the tenant in ctx, as Begin.
// A read-only transaction (AccessMode pgx.ReadOnly) is routed as the calls
// of a ReadOnly context are.
func (p *Pool) BeginTx(ctx context.Context, txOptions pgx.TxOptions) (_ pgx.Tx, err error) {
	if txOptions.AccessMode == pgx.ReadOnly && p.servers != nil && !IsReadOnly(ctx) {
		ctx = ReadOnly(ctx)
	}
	var h held
	ctx, err = p.hold(ctx, &h)
	if err != nil {
		return nil, err
	}
	tx := &tenantTx{h: h}
	defer func() {
		if tx.Tx == nil { // failed, or a hook panicked
			tx.h.release(&err)
		}
	}()
	t, err := tx.h.run.begin(ctx, txOptions)
	if err != nil {
		return nil, err
	}
	tx.Tx = t
	tx.w = watchHold(&tx.h, liveRef{}, pgx.ErrTxClosed)
	return tx, nil
}

// tenantTx releases the connection and slot it holds after Commit or
// Rollback, whether or not they succeed. Under a revocable cluster lease a
// revocation cancels the statement running, and the transaction's later
// statements fail with ErrRevoked. Under its tenant's
// IdleInTransactionTimeout or MaxHold, w (nil without them) sees each call
// and may end the transaction between two: then its later calls, Commit
// and Rollback fail with ErrIdleInTransaction or ErrMaxHold (and
// pgx.ErrTxClosed).
type tenantTx struct {
	pgx.Tx
	h held
	w *holdWatch
}

func (tx *tenantTx) Commit(ctx context.Context) (err error) {
	if err := tx.w.claim(); err != nil {
		return err
	}
	defer tx.h.release(&err)
	return tx.Tx.Commit(ctx)
}

func (tx *tenantTx) Rollback(ctx context.Context) (err error) {
	if err := tx.w.claim(); err != nil {
		return err
	}
	defer tx.h.release(&err)
	return tx.Tx.Rollback(ctx)
}

// Conn and LargeObjects are pgx's own: their use is out of sight of the
// time limits, which no longer end the transaction.
func (tx *tenantTx) Conn() *pgx.Conn {
	tx.w.disarm()
	return tx.Tx.Conn()
}

func (tx *tenantTx) LargeObjects() pgx.LargeObjects {
	tx.w.disarm()
	return tx.Tx.LargeObjects()
}

// revoked returns ErrRevoked once the transaction's cluster slot was
// revoked, ErrMoved once a Move ended it.
func (tx *tenantTx) revoked() error {
	return tx.h.guard.err()
}

func (tx *tenantTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := tx.revoked(); err != nil {
		return pgconn.CommandTag{}, err
	}
	if err := tx.w.enter(); err != nil {
		return pgconn.CommandTag{}, err
	}
	defer tx.w.leave()
	tag, err := tx.Tx.Exec(ctx, sql, args...)
	return tag, tx.h.check(err)
}

func (tx *tenantTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := tx.revoked(); err != nil {
		return errRows{err}, err
	}
	if err := tx.w.enter(); err != nil {
		return errRows{err}, err
	}
	rows, err := tx.Tx.Query(ctx, sql, args...)
	if err != nil || tx.w == nil {
		tx.w.leave()
		return rows, tx.h.check(err)
	}
	return &tenantRows{Rows: rows, ref: liveRef{w: tx.w}, permit: tx.h.permit}, nil // busy until done
}

func (tx *tenantTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := tx.revoked(); err != nil {
		return errRow{err}
	}
	if tx.w == nil {
		return &tenantRow{row: tx.Tx.QueryRow(ctx, sql, args...), g: tx.h.guard}
	}
	if err := tx.w.enter(); err != nil {
		return errRow{err}
	}
	return &tenantRow{row: tx.Tx.QueryRow(ctx, sql, args...), ref: liveRef{w: tx.w}, g: tx.h.guard} // busy until scanned
}

func (tx *tenantTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := tx.revoked(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if tx.w == nil {
		return tx.Tx.SendBatch(ctx, b)
	}
	if err := tx.w.enter(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return &connBatch{BatchResults: tx.Tx.SendBatch(ctx, b), ref: liveRef{w: tx.w}} // busy until closed
}

func (tx *tenantTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := tx.revoked(); err != nil {
		return 0, err
	}
	if err := tx.w.enter(); err != nil {
		return 0, err
	}
	defer tx.w.leave()
	n, err := tx.Tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, tx.h.check(err)
}

func (tx *tenantTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := tx.revoked(); err != nil {
		return nil, err
	}
	if err := tx.w.enter(); err != nil {
		return nil, err
	}
	defer tx.w.leave()
	return tx.Tx.Prepare(ctx, name, sql)
}

func (tx *tenantTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := tx.revoked(); err != nil {
		return nil, err
	}
	if tx.w == nil {
		nested, err := tx.Tx.Begin(ctx)
		if err != nil {
			return nil, tx.h.guard.wrap(err)
		}
		return &connTx{Tx: nested, g: tx.h.guard}, nil
	}
	if err := tx.w.enter(); err != nil {
		return nil, err
	}
	defer tx.w.leave()
	nested, err := tx.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &connTx{Tx: nested, ref: liveRef{w: tx.w}, g: tx.h.guard}, nil // a savepoint: its calls are the Tx's
}
