package tenantsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tenantdb/tenantdb/internal/rejected"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// conn is one database/sql connection: a tenant's slot and a connection of
// the shared pgxpool, or, until a statement brings a tenant, nothing.
// database/sql calls it from one goroutine at a time.
type conn struct {
	c     *connector
	slot  *tenantdb.Slot      // nil until bound
	pg    *stdlib.Conn        // nil until bound
	local string              // with ScopeTransaction, the statement that sets the tenant's values; else ""
	w     *tenantdb.SlotWatch // the tenant's IdleInTransactionTimeout and MaxHold; nil without them
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
)

// bind takes a slot for the tenant in ctx and a shared connection, both with
// ctx. Its errors are tenantdb's (ErrNoTenant, *OverLimitError, ErrClosed)
// or the acquire's, never driver.ErrBadConn.
func (cn *conn) bind(ctx context.Context) error {
	slot, err := cn.c.p.Admit(ctx)
	if err != nil {
		return err
	}
	pgc := cn.c.pg
	if pg := slot.Pgxpool(); pg != cn.c.p.Pgxpool() { // Config.Database: the tenant's database
		pgc = stdlib.GetPoolConnector(pg, cn.c.stdlibOpts...)
	}
	var dc driver.Conn
	for round := 1; ; round++ { // see package rejected
		dc, err = pgc.Connect(slot.AcquireContext(ctx))
		if !rejected.Again(ctx, err, round) {
			break
		}
	}
	if err != nil {
		slot.Release()
		return err
	}
	pg := dc.(*stdlib.Conn)
	slot.Attach(pg.Conn().PgConn())
	local, err := slot.LocalSettings()
	if err != nil {
		slot.Detach()
		_ = pg.Close()
		slot.Release()
		return err
	}
	cn.slot, cn.pg, cn.local = slot, pg, local
	cn.w = slot.Watch(cn.give, sql.ErrConnDone)
	return nil
}

// give returns the shared connection to the pgxpool, after the reset at
// release if it needs one, and the slot to the tenant, in that order (a
// CancelRequest of a revocation in flight is waited for first).
func (cn *conn) give() {
	cn.slot.Detach()
	pg := cn.pg
	cn.slot.Return(pg.Conn(), func() { _ = pg.Close() }) // a pool connection's Close only releases it
	cn.slot.Release()
}

// enter readies the connection for a call (ready) and starts the call
// under the tenant's time limits: each enter that returns nil needs a
// cn.w.Leave. A call after the watch ended the hold fails with
// tenantdb.ErrIdleInTransaction or tenantdb.ErrMaxHold (and
// sql.ErrConnDone), before it touches the connection.
func (cn *conn) enter(ctx context.Context) error {
	if err := cn.ready(ctx); err != nil {
		return err
	}
	return cn.w.Enter()
}

// ready binds the connection on its first statement, if Connect had no
// tenant. It refuses a statement whose context carries another tenant than
// the connection's (a Tx or Conn of one tenant used with another's context),
// and statements after a revocation.
func (cn *conn) ready(ctx context.Context) error {
	id, ok := tenantdb.TenantFrom(ctx)
	if cn.pg == nil {
		if !ok {
			return tenantdb.ErrNoTenant
		}
		return cn.bind(ctx)
	}
	if ok && id != cn.slot.Tenant() {
		return fmt.Errorf("%w: the context carries tenant %q, the connection is tenant %q's",
			ErrTenantMismatch, id, cn.slot.Tenant())
	}
	return cn.slot.Err() // tenantdb.ErrRevoked, or ErrMoved
}

// wrap makes err, from work stopped by a revocation or a move, match
// tenantdb.ErrRevoked or ErrMoved.
func (cn *conn) wrap(err error) error {
	if err == nil || cn.slot == nil {
		return err
	}
	cause := cn.slot.Err()
	if cause == nil || errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w: %w", cause, err)
}

func (cn *conn) Prepare(query string) (driver.Stmt, error) {
	return cn.PrepareContext(context.Background(), query)
}

func (cn *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if err := cn.enter(ctx); err != nil {
		return nil, err
	}
	defer cn.w.Leave()
	if cn.local != "" && cn.idle() {
		// Parsed now, outside a transaction, the statement would resolve
		// its names before the tenant's search_path is set: it is sent
		// with its arguments, in each call's transaction, instead.
		return &localStmt{cn: cn, query: query}, nil
	}
	st, err := cn.pg.PrepareContext(ctx, query)
	if err != nil {
		return nil, cn.wrap(err)
	}
	if cn.local == "" {
		if cn.w == nil {
			return st, nil
		}
		return &watchedStmt{Stmt: st.(*stdlib.Stmt), cn: cn}, nil
	}
	return &localStmt{st: st.(*stdlib.Stmt), cn: cn, query: query}, nil
}

// Close gives the connection and the slot back (give), unless the tenant's
// time limits ended the hold and did. database/sql calls it once.
func (cn *conn) Close() error {
	if cn.pg == nil || cn.w.Claim() != nil {
		return nil
	}
	cn.give()
	return nil
}

func (cn *conn) Begin() (driver.Tx, error) {
	return cn.BeginTx(context.Background(), driver.TxOptions{})
}

func (cn *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if err := cn.enter(ctx); err != nil {
		return nil, err
	}
	defer cn.w.Leave()
	tx, err := cn.pg.BeginTx(ctx, opts)
	if err != nil {
		return nil, cn.wrap(err)
	}
	if cn.local != "" {
		if _, err := cn.pg.Conn().Exec(ctx, cn.local); err != nil {
			_ = tx.Rollback()
			return nil, cn.wrap(err)
		}
	}
	if cn.w == nil {
		return tx, nil
	}
	return &watchedTx{tx: tx, cn: cn}, nil
}

func (cn *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := cn.enter(ctx); err != nil {
		return nil, err
	}
	defer cn.w.Leave()
	return statement(ctx, cn, query, args, (*conn).execLocal, (*stdlib.Conn).ExecContext)
}

func (cn *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := cn.enter(ctx); err != nil {
		return nil, err
	}
	rows, err := statement(ctx, cn, query, args, (*conn).queryLocal, (*stdlib.Conn).QueryContext)
	if err != nil {
		cn.w.Leave()
		return nil, err
	}
	return cn.watchRows(rows), nil // a call in progress until closed
}

// statement runs query on cn, ready: with local, which sets the tenant's
// ScopeTransaction values first, when cn has them and is outside a
// transaction; with plain, stdlib's, otherwise. Its error is wrapped.
func statement[R any](ctx context.Context, cn *conn, query string, args []driver.NamedValue,
	local func(*conn, context.Context, string, []driver.NamedValue) (R, error),
	plain func(*stdlib.Conn, context.Context, string, []driver.NamedValue) (R, error)) (R, error) {
	var r R
	var err error
	if cn.local != "" && cn.idle() {
		r, err = local(cn, ctx, query, args)
	} else {
		r, err = plain(cn.pg, ctx, query, args)
	}
	return r, cn.wrap(err)
}

// Ping checks the server. On a connection without a tenant it is
// tenantdb.Pool.Ping with ctx: a health check without a tenant slot, or a
// tenant's call with one.
func (cn *conn) Ping(ctx context.Context) error {
	if cn.pg == nil {
		return cn.c.p.Ping(ctx)
	}
	if err := cn.slot.Err(); err != nil {
		return err
	}
	if err := cn.w.Enter(); err != nil {
		return err
	}
	defer cn.w.Leave()
	return cn.pg.Ping(ctx)
}

// Conn returns the pgx connection under the database/sql connection, for
// pgx features database/sql lacks (CopyFrom, batches) through sql.Conn.Raw:
// dc.(interface{ Conn() *pgx.Conn }).Conn(). It is nil until a statement
// with a tenant bound the connection (db.Conn with a tenant binds it at
// once). Statements sent on it directly do not get ScopeTransaction's
// setting, and are out of sight of the tenant's IdleInTransactionTimeout
// and MaxHold, which no longer end the connection's hold; nil if they
// already did.
func (cn *conn) Conn() *pgx.Conn {
	if cn.pg == nil || !cn.w.Disarm() {
		return nil
	}
	return cn.pg.Conn()
}

// CheckNamedValue accepts every argument, as stdlib.Conn does: pgx encodes
// driver.Valuer and its own types itself.
func (cn *conn) CheckNamedValue(*driver.NamedValue) error { return nil }

// ResetSession is never needed, since database/sql does not reuse these
// connections; it reports the connection as usable.
func (cn *conn) ResetSession(ctx context.Context) error { return nil }

// IsValid reports false, so that database/sql closes the connection when it
// is done with it instead of keeping it idle or handing it to another
// caller, who may be another tenant.
func (cn *conn) IsValid() bool { return false }
