package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

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
	st    *connState // conn's: each statement marks the session for the reset at release
}

// runner sets *r to the runner of the tenant in ctx on conn, whose
// statements run under timeout (when positive) with ScopeTransaction; with
// ScopeSession, prepare set it on the session. On an error *r runs
// statements without the setting.
func (s *sessionSetup) runner(ctx context.Context, conn *pgx.Conn, timeout time.Duration, r *runner) error {
	r.conn, r.st = conn, stateOf(conn.PgConn())
	r.st.setup = s
	if s == nil || s.cfg.Scope != ScopeTransaction || !sessionEnabled(&s.cfg) && timeout <= 0 {
		return nil
	}
	tenant, _ := TenantFrom(ctx)
	local, err := s.localStatement(tenant, conn.PgConn(), timeout)
	if err != nil {
		return err
	}
	r.local = local
	return nil
}

// used marks the session as one a statement may have changed, to be reset
// at release.
func (r runner) used() {
	if r.st != nil {
		r.st.dirty = true
	}
}

// usedSQL is used for sql, which may also drop statements pgx prepared.
func (r runner) usedSQL(sql string) {
	if r.st != nil {
		r.st.dirty = true
		r.st.forget = r.st.forget || containsFold(sql, "deallocate")
	}
}

// containsFold reports whether s contains word (lower-case ASCII) in any
// case, without allocating.
func containsFold(s, word string) bool {
	for i := 0; i+len(word) <= len(s); i++ {
		j := 0
		for j < len(word) && s[i+j]|0x20 == word[j] {
			j++
		}
		if j == len(word) {
			return true
		}
	}
	return false
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

// closer is what a statement's rows hold open under ScopeTransaction: the
// batch they came in, or the transaction that carries the setting.
type closer interface{ Close() error }

// exec runs sql. Without arguments it keeps pgx's simple protocol, so that
// sql may hold several statements; the setting is put in front of them, or
// right after a leading BEGIN (see WithLocalSettings).
func (r runner) exec(ctx context.Context, sql string, args []any) (pgconn.CommandTag, error) {
	r.usedSQL(sql)
	switch {
	case !r.sets():
		return r.conn.Exec(ctx, sql, args...)
	case hasBatchlessOption(args):
		return r.execInTx(ctx, sql, args)
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

// query runs sql. With ScopeTransaction it also returns the batch (or
// transaction) it was sent in, to be closed after the rows.
func (r runner) query(ctx context.Context, sql string, args []any) (pgx.Rows, closer, error) {
	r.usedSQL(sql)
	if !r.sets() {
		rows, err := r.conn.Query(ctx, sql, args...)
		return rows, nil, err
	}
	if hasBatchlessOption(args) {
		return r.queryInTx(ctx, sql, args)
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
// batch (or transaction) it was sent in, to be closed after the row is
// scanned.
func (r runner) queryRow(ctx context.Context, sql string, args []any) (pgx.Row, closer) {
	r.usedSQL(sql)
	if !r.sets() {
		return r.conn.QueryRow(ctx, sql, args...), nil
	}
	if hasBatchlessOption(args) {
		rows, tx, err := r.queryInTx(ctx, sql, args)
		if err != nil {
			return errRow{err}, nil
		}
		return rowOf(rows), tx
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
	for _, q := range b.QueuedQueries {
		r.usedSQL(q.SQL)
	}
	r.used()
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
// the same round trip as BEGIN, after it.
func (r runner) begin(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	r.used()
	if r.local == "" {
		return r.conn.BeginTx(ctx, opts)
	}
	b := &pgx.Batch{}
	b.BeginTx(opts)
	b.Queue(r.local)
	br := r.conn.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil {
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
	r.used()
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

// hasBatchlessOption reports whether args begin with a pgx query option
// that a pgx.Batch does not take (an exec mode, result formats), among the
// options pgx reads off the front of a query's arguments. A batch would send
// it as a parameter; such a statement runs in a transaction that carries the
// setting instead, where pgx reads its options as usual.
func hasBatchlessOption(args []any) bool {
	for _, a := range args {
		switch a.(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return true
		case pgx.QueryRewriter:
		default:
			return false
		}
	}
	return false
}

// settingTx begins, or joins, the transaction a statement with a batchless
// option runs in: outside a transaction, one that begins with the setting
// (one round trip) and ends with end; inside the connection's own, the
// setting runs in it first and end does nothing.
func (r runner) settingTx(ctx context.Context) (*txEnd, error) {
	if r.conn.PgConn().TxStatus() != txIdle {
		if _, err := r.conn.Exec(ctx, r.local); err != nil {
			return nil, err
		}
		return &txEnd{}, nil
	}
	tx, err := r.begin(ctx, pgx.TxOptions{})
	if err != nil {
		return nil, err
	}
	return &txEnd{ctx: ctx, tx: tx}, nil
}

// txEnd ends the transaction settingTx began, if any: Close commits it,
// or rolls it back after a failure.
type txEnd struct {
	ctx    context.Context
	tx     pgx.Tx
	failed bool
}

func (e *txEnd) Close() error {
	if e.tx == nil {
		return nil
	}
	tx := e.tx
	e.tx = nil
	if e.failed {
		return tx.Rollback(e.ctx)
	}
	err := tx.Commit(e.ctx)
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return nil // the statement's own error says why
	}
	return err
}

// execInTx runs sql, whose arguments carry a batchless option, in the
// setting's transaction.
func (r runner) execInTx(ctx context.Context, sql string, args []any) (pgconn.CommandTag, error) {
	end, err := r.settingTx(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := r.conn.Exec(ctx, sql, args...)
	end.failed = err != nil
	if cerr := end.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// queryInTx runs sql, whose arguments carry a batchless option, in the
// setting's transaction, which the returned closer ends after the rows.
func (r runner) queryInTx(ctx context.Context, sql string, args []any) (pgx.Rows, closer, error) {
	end, err := r.settingTx(ctx)
	if err != nil {
		return errRows{err}, nil, err
	}
	rows, err := r.conn.Query(ctx, sql, args...)
	if err != nil {
		rows.Close()
		end.failed = true
		_ = end.Close()
		return errRows{err}, nil, err
	}
	return rows, end, nil
}

// rowOf is pgx's QueryRow on rows: Scan reads the first row and closes them,
// failing with pgx.ErrNoRows without one.
func rowOf(rows pgx.Rows) pgx.Row { return rowScanner{rows} }

type rowScanner struct{ rows pgx.Rows }

func (r rowScanner) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
