package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// runner runs one tenant's statements on a held connection. With
// ScopeTransaction, local is the statement that sets the tenant's values for
// the current transaction, and every statement is sent together with it, in
// one round trip: outside an explicit transaction in one implicit
// transaction, inside one as part of it. A transaction that failed gets no
// setting (PostgreSQL would refuse it, and ROLLBACK or ROLLBACK TO
// SAVEPOINT with it); its statements go to pgx as they are, as do all
// statements when local is "".
type runner struct {
	conn  *pgx.Conn
	local string
}

// runner returns the runner of the tenant in ctx on conn.
func (s *sessionSetup) runner(ctx context.Context, conn *pgx.Conn) (runner, error) {
	if !s.transactional() {
		return runner{conn: conn}, nil
	}
	tenant, _ := TenantFrom(ctx)
	local, err := s.localStatement(tenant, conn.PgConn())
	if err != nil {
		return runner{conn: conn}, err
	}
	return runner{conn: conn, local: local}, nil
}

// sets reports whether the next statement must carry the tenant's setting:
// with ScopeTransaction, unless the connection's transaction has failed.
func (r runner) sets() bool {
	return r.local != "" && r.conn.PgConn().TxStatus() != txFailed
}

// The transaction status of a connection, as PostgreSQL reports it in
// ReadyForQuery.
const (
	txIdle   = 'I'
	txFailed = 'E'
)

// withLocal returns a batch that runs the tenant's setting and then sql.
func (r runner) withLocal(sql string, args []any) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(r.local)
	b.Queue(sql, args...)
	return b
}

// exec runs sql. Without arguments it keeps pgx's simple protocol, so that
// sql may hold several statements; the setting is put in front of them, or
// right after a leading BEGIN (see WithLocalSettings).
func (r runner) exec(ctx context.Context, sql string, args []any) (pgconn.CommandTag, error) {
	switch {
	case !r.sets():
		return r.conn.Exec(ctx, sql, args...)
	case len(args) == 0:
		tag, err := r.conn.Exec(ctx, WithLocalSettings(sql, r.local))
		return tag, inTransactionBlock(err)
	}
	br := r.conn.SendBatch(ctx, r.withLocal(sql, args))
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	return tag, inTransactionBlock(closeBatch(br, err))
}

// query runs sql. With ScopeTransaction it also returns the batch it was
// sent in, to be closed after the rows.
func (r runner) query(ctx context.Context, sql string, args []any) (pgx.Rows, pgx.BatchResults, error) {
	if !r.sets() {
		rows, err := r.conn.Query(ctx, sql, args...)
		return rows, nil, err
	}
	br := r.conn.SendBatch(ctx, r.withLocal(sql, args))
	if _, err := br.Exec(); err != nil {
		return errRows{err}, nil, closeBatch(br, err)
	}
	rows, err := br.Query()
	if err != nil {
		rows.Close()
		err = inTransactionBlock(closeBatch(br, err))
		return errRows{err}, nil, err
	}
	return rows, br, nil
}

// queryRow runs sql for one row. With ScopeTransaction it also returns the
// batch it was sent in, to be closed after the row is scanned.
func (r runner) queryRow(ctx context.Context, sql string, args []any) (pgx.Row, pgx.BatchResults) {
	if !r.sets() {
		return r.conn.QueryRow(ctx, sql, args...), nil
	}
	br := r.conn.SendBatch(ctx, r.withLocal(sql, args))
	if _, err := br.Exec(); err != nil {
		return errRow{closeBatch(br, err)}, nil
	}
	return br.QueryRow(), br
}

// sendBatch sends b. With ScopeTransaction, b gains the setting as its first
// query, whose result is read here: b's own results follow as usual, and a
// batch that begins a transaction (pgx.Batch.BeginTx) keeps the setting in
// it, since a BEGIN turns the implicit transaction into an explicit one.
// After a BEGIN that comes first in b, the setting goes second: a BEGIN with
// an isolation level must be the first statement of its transaction.
func (r runner) sendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if !r.sets() {
		return r.conn.SendBatch(ctx, b)
	}
	if q := b.QueuedQueries; len(q) > 0 && len(q[0].Arguments) == 0 && beginOnly(q[0].SQL) {
		b.QueuedQueries = slices.Insert(q, 1, &pgx.QueuedQuery{SQL: r.local})
		return &afterBegin{BatchResults: r.conn.SendBatch(ctx, b)}
	}
	b.QueuedQueries = append([]*pgx.QueuedQuery{{SQL: r.local}}, b.QueuedQueries...)
	br := r.conn.SendBatch(ctx, b)
	_, _ = br.Exec() // an error here is every later result's error too
	return br
}

// begin starts a transaction. With ScopeTransaction the setting is sent in
// the same round trip as BEGIN; so is a reset armed on the connection, which
// travels only with extended-protocol messages (see wireConn), as a batch's.
func (r runner) begin(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	if r.local == "" && !wireOf(r.conn.PgConn().Conn()).armed() {
		return r.conn.BeginTx(ctx, opts)
	}
	b := &pgx.Batch{}
	b.BeginTx(opts)
	if r.local != "" {
		b.Queue(r.local)
	}
	br := r.conn.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil && r.local != "" {
		_, err = br.Exec()
	}
	tx := br.Tx()
	if err = closeBatch(br, err); err != nil {
		_ = tx.Rollback(ctx) // a no-op when BEGIN itself failed
		return nil, err
	}
	return tx, nil
}

// copyFrom runs COPY. With ScopeTransaction, COPY cannot share a batch:
// outside a transaction it runs in a transaction of its own that carries the
// setting; inside one it runs in it, after the setting.
func (r runner) copyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if !r.sets() {
		return r.conn.CopyFrom(ctx, table, columns, src)
	}
	if r.conn.PgConn().TxStatus() != txIdle {
		if _, err := r.conn.Exec(ctx, r.local); err != nil {
			return 0, err
		}
		return r.conn.CopyFrom(ctx, table, columns, src)
	}
	tx, err := r.begin(ctx, pgx.TxOptions{})
	if err != nil {
		return 0, err
	}
	n, err := tx.CopyFrom(ctx, table, columns, src)
	if err != nil {
		_ = tx.Rollback(ctx)
		return 0, err
	}
	return n, tx.Commit(ctx)
}

// inTransactionBlock makes err match ErrCannotRunInTransaction when
// PostgreSQL refused a statement because ScopeTransaction put it in a
// transaction block.
func inTransactionBlock(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "25001" {
		return fmt.Errorf("%w: %w", ErrCannotRunInTransaction, err)
	}
	return err
}

// closeBatch closes br and returns err, or Close's error if err is nil.
func closeBatch(br pgx.BatchResults, err error) error {
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}
