package tenantdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// Conn is a connection acquired for a tenant. It holds the tenant's slot and
// the shared connection until Release. It is a small value, so that Acquire
// allocates nothing: copies refer to the same connection, and releasing any
// of them releases it once. Like pgxpool.Conn, it is for one goroutine at a
// time, and must not be used after Release.
//
// With a cluster limiter that revokes leases (pool/redislimit in FailClosed
// mode), a revocation of the Conn's cluster slot cancels the statement it
// runs (a CancelRequest to PostgreSQL) and every later call on it fails
// with ErrRevoked; statements of a pgx.Tx or pgx.Rows obtained from it
// before are cancelled, not refused. Release it as usual.
type Conn struct {
	c      *pgxpool.Conn
	permit pool.Permit
	g      *revokeGuard // nil without a revocable cluster lease
}

// Release returns the connection to the shared pool and the slot to the
// tenant. Only the first call (on any copy) has an effect: pgxpool's Conns
// are never reused and permits carry a generation. A connection that broke
// is closed by pgxpool, and the slot is returned all the same.
func (c Conn) Release() {
	if c.c == nil {
		return
	}
	c.g.stop() // before the connection may serve another request
	c.c.Release()
	c.permit.Release()
}

// Hijack takes the connection out of the shared pool; the caller must close
// it. The tenant's slot is returned at once, since the pool no longer counts
// the connection. With Config.Session it keeps the tenant's session state:
// nothing resets it, since it never returns to the pool.
func (c Conn) Hijack() *pgx.Conn {
	c.g.stop()
	conn := c.c.Hijack() // a later Release of c is then a no-op for pgxpool
	c.permit.Release()
	return conn
}

// Exec runs sql on the connection.
func (c Conn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if c.g.isRevoked() {
		return pgconn.CommandTag{}, ErrRevoked
	}
	tag, err := c.c.Exec(ctx, sql, args...)
	return tag, c.g.wrap(err)
}

// Query runs sql on the connection. The rows do not hold a slot of their own:
// the Conn does.
func (c Conn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if c.g.isRevoked() {
		return errRows{ErrRevoked}, ErrRevoked
	}
	return c.c.Query(ctx, sql, args...)
}

// QueryRow runs sql on the connection.
func (c Conn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if c.g.isRevoked() {
		return errRow{ErrRevoked}
	}
	return c.c.QueryRow(ctx, sql, args...)
}

// SendBatch sends b on the connection.
func (c Conn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if c.g.isRevoked() {
		return pgx.FailedBatchResults(b, ErrRevoked)
	}
	return c.c.SendBatch(ctx, b)
}

// CopyFrom copies rows into tableName on the connection.
func (c Conn) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if c.g.isRevoked() {
		return 0, ErrRevoked
	}
	n, err := c.c.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, c.g.wrap(err)
}

// Begin starts a transaction on the connection; it ends with the Conn's
// Release at the latest.
func (c Conn) Begin(ctx context.Context) (pgx.Tx, error) {
	if c.g.isRevoked() {
		return nil, ErrRevoked
	}
	return c.c.Begin(ctx)
}

// BeginTx starts a transaction with txOptions on the connection.
func (c Conn) BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error) {
	if c.g.isRevoked() {
		return nil, ErrRevoked
	}
	return c.c.BeginTx(ctx, txOptions)
}

// Ping checks the connection.
func (c Conn) Ping(ctx context.Context) error {
	if c.g.isRevoked() {
		return ErrRevoked
	}
	return c.g.wrap(c.c.Ping(ctx))
}

// Conn returns the underlying *pgx.Conn.
func (c Conn) Conn() *pgx.Conn { return c.c.Conn() }
