package tenantdb

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// connLife is the record that an acquired Conn, its copies and what it
// hands out share: Release bumps gen, so that every holder of the old
// generation sees the Conn as released. There is one per pooled connection,
// in its connState, so that Acquire allocates nothing: the connection has
// one holder at a time, and a stale holder's generation never comes back.
type connLife struct {
	gen atomic.Uint64
}

// liveRef is a reference to one generation of a connLife. The zero liveRef
// refers to nothing and is never stale: it is what the Pool's own calls,
// which hold their connection themselves, carry. w is the hold's watch
// (IdleInTransactionTimeout, MaxHold), nil without one; a Tx's references
// have a watch and no life.
type liveRef struct {
	life *connLife
	gen  uint64
	w    *holdWatch
}

// newLiveRef starts the life of a newly acquired Conn, on its connection's
// record.
func newLiveRef(l *connLife) liveRef {
	return liveRef{life: l, gen: l.gen.Load()}
}

// stale reports whether the Conn that r refers to was released.
func (r liveRef) stale() bool { return r.life != nil && r.life.gen.Load() != r.gen }

// err returns ErrConnReleased when r is stale.
func (r liveRef) err() error {
	if r.stale() {
		return ErrConnReleased
	}
	return nil
}

// enter starts a call on the Conn or Tx that r refers to, or returns why it
// cannot: ErrConnReleased, or the error of a hold its watch ended. A call
// that enter started ends with leave.
func (r liveRef) enter() error {
	if r.w != nil {
		return r.w.enter()
	}
	return r.err()
}

// leave ends a call that enter started.
func (r liveRef) leave() { r.w.leave() }

// inner is r for what a call hands out inside a call already entered (the
// results of a batch): they check the life, and leave nothing.
func (r liveRef) inner() liveRef { return liveRef{life: r.life, gen: r.gen} }

// end ends the life r refers to and reports whether this call did: only the
// first of the Conn's Releases (or Hijack) does.
func (r liveRef) end() bool {
	return r.life != nil && r.life.gen.CompareAndSwap(r.gen, r.gen+1)
}

// connTx is a transaction (or savepoint) begun on a Conn: it fails with
// ErrConnReleased once the Conn is released, and so do its nested
// transactions, rows and batches. Its LargeObjects and Conn are pgx's own,
// unseen by a hold's watch, which they stop. It is also a savepoint of a
// Tx under a hold watch (a ref with no life).
type connTx struct {
	pgx.Tx
	ref liveRef
	g   *revokeGuard // the Conn's or Tx's: errors match ErrMoved or ErrRevoked when either stopped the work
}

// wrap makes err match the cause of a stop of the work (revokeGuard.wrap).
func (tx *connTx) wrap(err error) error {
	if tx.g == nil {
		return err
	}
	return tx.g.wrap(err)
}

func (tx *connTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := tx.ref.enter(); err != nil {
		return nil, err
	}
	defer tx.ref.leave()
	nested, err := tx.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &connTx{Tx: nested, ref: tx.ref, g: tx.g}, nil
}

func (tx *connTx) Commit(ctx context.Context) error {
	if err := tx.ref.enter(); err != nil {
		return err
	}
	defer tx.ref.leave()
	return tx.Tx.Commit(ctx)
}

func (tx *connTx) Rollback(ctx context.Context) error {
	if err := tx.ref.enter(); err != nil {
		return err
	}
	defer tx.ref.leave()
	return tx.Tx.Rollback(ctx)
}

func (tx *connTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := tx.ref.enter(); err != nil {
		return pgconn.CommandTag{}, err
	}
	defer tx.ref.leave()
	tag, err := tx.Tx.Exec(ctx, sql, args...)
	return tag, tx.wrap(err)
}

func (tx *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := tx.ref.enter(); err != nil {
		return errRows{err}, err
	}
	rows, err := tx.Tx.Query(ctx, sql, args...)
	if err != nil {
		tx.ref.leave()
		return rows, tx.wrap(err)
	}
	return &tenantRows{Rows: rows, ref: tx.ref}, nil
}

func (tx *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := tx.ref.enter(); err != nil {
		return errRow{err}
	}
	return &tenantRow{row: tx.Tx.QueryRow(ctx, sql, args...), ref: tx.ref, g: tx.g}
}

func (tx *connTx) Conn() *pgx.Conn {
	tx.ref.w.disarm()
	return tx.Tx.Conn()
}

func (tx *connTx) LargeObjects() pgx.LargeObjects {
	tx.ref.w.disarm()
	return tx.Tx.LargeObjects()
}

func (tx *connTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := tx.ref.enter(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return &connBatch{BatchResults: tx.Tx.SendBatch(ctx, b), ref: tx.ref}
}

func (tx *connTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := tx.ref.enter(); err != nil {
		return 0, err
	}
	defer tx.ref.leave()
	return tx.Tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (tx *connTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := tx.ref.enter(); err != nil {
		return nil, err
	}
	defer tx.ref.leave()
	return tx.Tx.Prepare(ctx, name, sql)
}

// connBatch is a batch sent on a Conn (or a Tx under a hold watch): reading
// its results after the Conn's Release fails with ErrConnReleased. Close is
// idempotent, and ends the call that sent it for the watch.
type connBatch struct {
	pgx.BatchResults
	ref    liveRef
	closed bool
	err    error // Close's
}

func (b *connBatch) Exec() (pgconn.CommandTag, error) {
	if err := b.ref.err(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return b.BatchResults.Exec()
}

func (b *connBatch) Query() (pgx.Rows, error) {
	if err := b.ref.err(); err != nil {
		return errRows{err}, err
	}
	rows, err := b.BatchResults.Query()
	if err != nil {
		return rows, err
	}
	return &tenantRows{Rows: rows, ref: b.ref.inner()}, nil
}

func (b *connBatch) QueryRow() pgx.Row {
	if err := b.ref.err(); err != nil {
		return errRow{err}
	}
	return &tenantRow{row: b.BatchResults.QueryRow(), ref: b.ref.inner()}
}

// Close closes the results; after the Conn's Release it touches nothing
// and fails, unless the results were closed before.
func (b *connBatch) Close() error {
	if b.closed {
		return b.err
	}
	b.closed = true
	if b.err = b.ref.err(); b.err == nil {
		b.err = b.BatchResults.Close()
		b.ref.leave() // the call that sent the batch is done
	}
	return b.err
}

func (b *connBatch) Tx() pgx.Tx {
	tx := b.BatchResults.Tx()
	if tx == nil {
		return nil
	}
	return &connTx{Tx: tx, ref: b.ref}
}
