package tenantdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Conn is a connection acquired for a tenant. It holds the tenant's slot and
// the shared connection until Release. It is a small value, so that Acquire
// allocates nothing: copies refer to the same connection, and releasing any
// of them releases it once. Like pgxpool.Conn, it is for one goroutine at a
// time. After Release every use of it, of its copies and of the Tx, Rows,
// Row and BatchResults it handed out fails with ErrConnReleased: the
// connection may be another tenant's by then. Its statements run for the
// tenant it was acquired for, with Config.Session's scope, whatever tenant
// their own contexts carry.
//
// With a cluster limiter that revokes leases (pool/redislimit in FailClosed
// mode), a revocation of the Conn's cluster slot cancels the statement it
// runs (a CancelRequest to PostgreSQL) and every later call on it fails
// with ErrRevoked; statements of a pgx.Tx or pgx.Rows obtained from it
// before are cancelled, not refused. Release it as usual.
type Conn struct {
	h   held
	ref liveRef // shared by the copies; the zero Conn's is nil, and released
}

// Acquire takes a slot for the tenant in ctx and a connection from the shared
// pool. ctx governs both waits. The Conn holds both until its Release.
func (p *Pool) Acquire(ctx context.Context) (c Conn, err error) {
	if _, err = p.hold(ctx, &c.h); err != nil { // the Conn's calls bring their own contexts
		return Conn{}, err
	}
	c.ref = newLiveRef(&c.h.run.st.life)
	c.ref.w = watchHold(&c.h, c.ref, ErrConnReleased)
	return c, nil
}

// AcquireFunc acquires a Conn, calls f with it and releases it when f returns
// or panics. As with pgxpool, ctx governs the acquire, not f.
func (p *Pool) AcquireFunc(ctx context.Context, f func(Conn) error) error {
	c, err := p.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return f(c)
}

// Release returns the connection to the shared pool and the slot to the
// tenant. Only the first call (on any copy) has an effect. A connection
// that broke, or is returned busy or inside a transaction, is closed by
// pgxpool, and the slot is returned all the same.
//
// A Conn held longer than its tenant's MaxHold (pool.Plan), or left idle
// inside a transaction for its IdleInTransactionTimeout, is released by
// tenantdb, its transaction rolled back: its later uses fail with
// ErrMaxHold or ErrIdleInTransaction (and ErrConnReleased), and Release
// does nothing.
func (c Conn) Release() {
	if c.ref.w != nil && c.ref.w.claim() != nil {
		return // released before, by tenantdb or through a copy
	}
	if c.ref.end() {
		c.h.release(nil)
	}
}

// Hijack takes the connection out of the shared pool; the caller must close
// it. The tenant's slot is returned at once, since the pool no longer counts
// the connection. It keeps the tenant's session state: nothing resets it,
// since it never returns to the pool. The Conn is released by it: Hijack of
// a released Conn panics, as pgxpool's does.
func (c Conn) Hijack() *pgx.Conn {
	if c.ref.w.claim() != nil || !c.ref.end() {
		panic("tenantdb: Hijack of a released Conn")
	}
	c.h.guard.stopKeeping()
	conn := c.h.conn.Hijack()
	forgetState(conn.PgConn()) // out of the pool: its closing is its owner's
	c.h.permit.Release()
	c.h.db.done() // the connection stays counted in the budget until it is closed
	return conn
}

// use starts a call on the Conn, which ends with c.ref.leave(), or
// returns ErrConnReleased after the Conn's Release (ErrMaxHold or
// ErrIdleInTransaction with it when its time limits released it) and
// ErrRevoked once its cluster slot was revoked (ErrMoved once Pool.Move
// ended its call).
func (c Conn) use() error {
	if c.ref.life == nil {
		return ErrConnReleased
	}
	if err := c.ref.enter(); err != nil {
		return err
	}
	if err := c.h.guard.err(); err != nil {
		c.ref.leave()
		return err // ErrRevoked, or ErrMoved
	}
	return nil
}

// Exec runs sql on the connection.
func (c Conn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := c.use(); err != nil {
		return pgconn.CommandTag{}, err
	}
	defer c.ref.leave()
	tag, err := c.h.run.exec(ctx, sql, args)
	return tag, c.h.check(err)
}

// Query runs sql on the connection. The rows do not hold a slot of their own:
// the Conn does.
func (c Conn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := c.use(); err != nil {
		return errRows{err}, err
	}
	rows, batch, err := c.h.run.query(ctx, sql, args)
	if err != nil {
		c.ref.leave()
		return rows, c.h.check(err)
	}
	return &tenantRows{Rows: rows, batch: batch, ref: c.ref, permit: c.h.permit}, nil
}

// QueryRow runs sql on the connection.
func (c Conn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := c.use(); err != nil {
		return errRow{err}
	}
	row, batch := c.h.run.queryRow(ctx, sql, args)
	return &tenantRow{row: row, batch: batch, ref: c.ref, g: c.h.guard}
}

// SendBatch sends b on the connection.
func (c Conn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := c.use(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return &connBatch{BatchResults: c.h.run.sendBatch(ctx, b), ref: c.ref}
}

// CopyFrom copies rows into tableName on the connection.
func (c Conn) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := c.use(); err != nil {
		return 0, err
	}
	defer c.ref.leave()
	n, err := c.h.run.copyFrom(ctx, tableName, columnNames, rowSrc)
	return n, c.h.check(err)
}

// Begin starts a transaction on the connection; it ends with the Conn's
// Release at the latest.
func (c Conn) Begin(ctx context.Context) (pgx.Tx, error) {
	return c.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx starts a transaction with txOptions on the connection.
func (c Conn) BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error) {
	if err := c.use(); err != nil {
		return nil, err
	}
	defer c.ref.leave()
	tx, err := c.h.run.begin(ctx, txOptions)
	if err != nil {
		return nil, c.h.check(err)
	}
	return &connTx{Tx: tx, ref: c.ref, g: c.h.guard}, nil
}

// Ping checks the connection.
func (c Conn) Ping(ctx context.Context) error {
	if err := c.use(); err != nil {
		return err
	}
	defer c.ref.leave()
	return c.h.guard.wrap(c.h.conn.Ping(ctx))
}

// Conn returns the underlying *pgx.Conn, or nil after Release. Statements
// sent on it directly do not get ScopeTransaction's setting, and nothing
// stops them after Release: do not keep it. Its use is out of sight of
// MaxHold and IdleInTransactionTimeout, which no longer end the Conn.
func (c Conn) Conn() *pgx.Conn {
	if c.ref.life == nil || c.ref.stale() || !c.ref.w.disarm() {
		return nil
	}
	c.h.run.used() // statements may go out of tenantdb's sight
	return c.h.conn.Conn()
}
