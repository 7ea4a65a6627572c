package tenantdb

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tenantdb/tenantdb/pool"
)

// Exec runs sql for the tenant in ctx, holding its slot until Exec returns.
// ctx governs the tenant wait, the wait for a connection and the query.
func (p *Pool) Exec(ctx context.Context, sql string, args ...any) (_ pgconn.CommandTag, err error) {
	var h held
	ctx, err = p.hold(ctx, &h)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer h.release(&err) // also if an argument's encoder panics
	return h.run.exec(ctx, sql, args)
}

// Query runs sql for the tenant in ctx. The tenant's slot is held, with the
// connection, until the rows are closed, read to the end, or fail to scan
// (pgx closes rows on a Scan or Values error, and so does tenantdb).
func (p *Pool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	var h held
	ctx, err := p.hold(ctx, &h)
	if err != nil {
		return errRows{err}, err
	}
	r := &tenantRows{h: h}
	open := false
	defer func() {
		if !open { // an argument's encoder panicked
			r.release()
		}
	}()
	rows, batch, err := h.run.query(ctx, sql, args)
	if err != nil {
		r.release()
		err = h.guard.wrap(err)
		return errRows{err}, err
	}
	r.Rows, r.batch, open = rows, batch, true
	return r, nil
}

// tenantRows releases what it holds (the connection and slot of a Pool's
// Query, or the batch of a statement under ScopeTransaction) once the rows
// are done: on Close, when Next reports the end, and on a Scan or Values
// error, after which pgx's rows are closed. Rows of a Conn end, untouched,
// with ErrConnReleased once the Conn is released.
type tenantRows struct {
	pgx.Rows
	h     held
	batch closer  // ScopeTransaction's batch or transaction, or nil
	ref   liveRef // the Conn's, or zero for a Pool's Query
	err   error   // the batch's Close error, or ErrConnReleased
	done  bool
	// permit is a Conn's, for the statement timeouts of its rows; a Pool's
	// Query counts them through h.
	permit pool.Permit
}

func (r *tenantRows) Next() bool {
	if !r.live() {
		return false
	}
	if r.Rows.Next() {
		return true
	}
	r.release()
	return false
}

func (r *tenantRows) Scan(dest ...any) error {
	if !r.live() {
		return r.err
	}
	err := r.Rows.Scan(dest...)
	if err != nil {
		r.release()
	}
	return err
}

func (r *tenantRows) Values() ([]any, error) {
	if !r.live() {
		return nil, r.err
	}
	v, err := r.Rows.Values()
	if err != nil {
		r.release()
	}
	return v, err
}

func (r *tenantRows) RawValues() [][]byte {
	if !r.live() {
		return nil
	}
	return r.Rows.RawValues()
}

func (r *tenantRows) Conn() *pgx.Conn {
	if !r.live() {
		return nil
	}
	return r.Rows.Conn()
}

func (r *tenantRows) Close() {
	if r.live() {
		r.release()
	}
}

func (r *tenantRows) Err() error {
	if !r.live() {
		return r.err
	}
	err := r.Rows.Err()
	if err == nil {
		err = r.err
	}
	return r.h.guard.wrap(err)
}

// live reports whether the rows' Conn (if any) is still held; rows of a
// released Conn are done with ErrConnReleased, without touching pgx's rows,
// whose connection may be another holder's now.
func (r *tenantRows) live() bool {
	if !r.ref.stale() {
		return true
	}
	if !r.done {
		r.done, r.err = true, ErrConnReleased
	}
	return false
}

func (r *tenantRows) release() {
	if r.done {
		return
	}
	r.done = true
	var err error // the statement's, for the statement timeouts counted at release
	if r.Rows != nil {
		r.Rows.Close()
		err = r.Rows.Err()
	}
	if r.batch != nil {
		r.err = r.batch.Close()
	}
	countStatementTimeout(r.permit, err)
	r.h.release(&err)
	r.ref.leave() // a Conn's or a watched Tx's: the call that sent the query is done
}

// QueryRow runs sql for the tenant in ctx. The slot is held until Scan.
func (p *Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	var h held
	ctx, err := p.hold(ctx, &h)
	if err != nil {
		return errRow{err}
	}
	r := &tenantRow{h: h}
	defer func() {
		if r.row == nil { // an argument's encoder panicked
			r.release(nil)
		}
	}()
	r.row, r.batch = h.run.queryRow(ctx, sql, args)
	return r
}

// tenantRow releases what it holds when it is scanned, also if a Scanner
// panics. A row of a Conn fails with ErrConnReleased, untouched, once the
// Conn is released.
type tenantRow struct {
	row   pgx.Row
	h     held
	batch closer       // ScopeTransaction's batch or transaction, or nil
	ref   liveRef      // the Conn's, or zero for a Pool's QueryRow
	g     *revokeGuard // a Conn's or Tx's: its error matches ErrMoved or ErrRevoked when either stopped the work
}

func (r *tenantRow) Scan(dest ...any) (err error) {
	if err := r.ref.err(); err != nil {
		return err
	}
	defer r.release(&err)
	err = r.row.Scan(dest...)
	if r.g != nil {
		err = r.g.wrap(err)
	}
	return err
}

func (r *tenantRow) release(err *error) {
	if r.batch != nil {
		if cerr := r.batch.Close(); err != nil && *err == nil {
			*err = cerr
		}
	}
	r.h.release(err)
	r.ref.leave()
}

// SendBatch sends b for the tenant in ctx. The slot is held, with the
// connection, until the results are closed; or, when the batch begins a
// transaction (pgx.Batch.BeginTx), until that transaction is committed or
// rolled back. That transaction is under its tenant's
// IdleInTransactionTimeout and MaxHold as one from Begin, from when the
// results are closed (reading them counts as a call in progress).
func (p *Pool) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	var h held
	ctx, err := p.hold(ctx, &h)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	r := &tenantBatchResults{h: h}
	defer func() {
		if r.BatchResults == nil { // an argument's encoder panicked
			r.h.release(nil)
		}
	}()
	br := h.run.sendBatch(ctx, b)
	if tx := br.Tx(); tx != nil {
		r.tx = &tenantTx{Tx: tx, h: h}
		r.h = held{}
		r.tx.w = watchHold(&r.tx.h, liveRef{}, pgx.ErrTxClosed)
		_ = r.tx.w.enter() // a new watch: the results are a call in progress until Close
	}
	r.BatchResults = br
	return r
}

// tenantBatchResults releases what it holds on Close, also if a queued
// query's callback panics in it. When the batch began a transaction, the
// transaction holds the connection instead, unless it ended in the batch.
type tenantBatchResults struct {
	pgx.BatchResults
	h      held // zero when tx holds the connection
	tx     *tenantTx
	closed bool
	err    error // Close's
}

func (b *tenantBatchResults) Close() (err error) {
	if b.closed {
		return b.err
	}
	b.closed = true
	completed := false
	defer func() {
		b.h.release(&err)
		if tx := b.tx; tx != nil && tx.h.conn != nil && (!completed || !inTransaction(tx.h.conn.Conn())) {
			// A panic, a failed BEGIN or a transaction the batch ended:
			// nothing is left for Commit or Rollback to release. The
			// watch, busy with the results until now, cannot have.
			_ = tx.w.claim()
			tx.h.release(&err)
		} else if tx != nil {
			tx.w.leave() // the transaction's idle time counts from here
		}
		b.err = err
	}()
	err = b.BatchResults.Close()
	completed = true
	return err
}

// inTransaction reports whether conn is open and inside a transaction.
func inTransaction(conn *pgx.Conn) bool {
	return !conn.IsClosed() && conn.PgConn().TxStatus() != 'I'
}

// Exec, Query and QueryRow make the error of a statement that a Move or a
// revoked cluster slot stopped match its cause (ErrMoved, ErrRevoked), as
// Close's does.
func (b *tenantBatchResults) Exec() (pgconn.CommandTag, error) {
	tag, err := b.BatchResults.Exec()
	return tag, b.wrap(err)
}

func (b *tenantBatchResults) Query() (pgx.Rows, error) {
	rows, err := b.BatchResults.Query()
	return rows, b.wrap(err)
}

func (b *tenantBatchResults) QueryRow() pgx.Row {
	return batchRow{row: b.BatchResults.QueryRow(), b: b}
}

// batchRow is a batch's row whose Scan error matches the cause of a stop.
type batchRow struct {
	row pgx.Row
	b   *tenantBatchResults
}

func (r batchRow) Scan(dest ...any) error { return r.b.wrap(r.row.Scan(dest...)) }

// wrap makes err match ErrMoved or ErrRevoked when either stopped the
// batch's work.
func (b *tenantBatchResults) wrap(err error) error {
	g := b.h.guard
	if b.tx != nil {
		g = b.tx.h.guard
	}
	cause := g.err()
	if err == nil || cause == nil || errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w: %w", cause, err)
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
	var h held
	ctx, err = p.hold(ctx, &h)
	if err != nil {
		return 0, err
	}
	defer h.release(&err)
	return h.run.copyFrom(ctx, tableName, columnNames, rowSrc)
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
