// Package tenantsql puts a [tenantdb.Pool]'s tenant bulkheads under
// database/sql, for GORM, sqlx, bun, ent, goose and whatever else takes a
// *sql.DB.
//
//	db := tenantsql.OpenDB(p)
//	ctx = tenantdb.WithTenant(ctx, "acme")
//	rows, err := db.QueryContext(ctx, "select ...")
//
// Every connection database/sql checks out is taken for the tenant in the
// context of the call that needs it (QueryContext, ExecContext, BeginTx,
// Conn): first one of that tenant's slots, then a connection of the shared
// pgxpool, acquired with the same context so that Config.Session sets the
// tenant's state on it. Both go back when database/sql closes the connection:
// when the Rows are closed (Row.Scan closes them), when the Tx commits or
// rolls back, when the Conn is closed, when ExecContext returns.
//
// With tenantdb.ScopeTransaction the tenant's values are set
// transaction-locally in every transaction a statement runs in, so that they
// hold behind a transaction-pooling proxy: an ExecContext outside a
// transaction carries them in its implicit transaction, a QueryContext
// outside one runs in a transaction committed when its Rows are closed,
// BeginTx sets them after BEGIN, and prepared statements take the same
// paths: one prepared outside a transaction is sent with its arguments on
// each call, not prepared on the server, where its names would resolve
// before the tenant's search_path is set. A transaction begun with an SQL
// BEGIN (or START TRANSACTION) of your own, sent with ExecContext on an
// sql.Conn, gets them right after it, in the same round trip; one sent
// with QueryContext fails with ErrBeginWithQuery. Statements that cannot
// run inside a transaction block (CREATE INDEX CONCURRENTLY, VACUUM) fail
// with tenantdb.ErrCannotRunInTransaction there.
//
// A call without a tenant fails with tenantdb.ErrNoTenant, except a Ping, which is a
// health check as tenantdb.Pool.Ping is. Over-limit, no-tenant and
// closed-pool errors reach the caller as tenantdb's own errors, never as
// driver.ErrBadConn, so database/sql does not retry them. When a tenant's
// cluster-wide slot is revoked (tenantdb.ErrRevoked), the statement running
// on its connection is cancelled and later ones on it are refused.
//
// Under the tenant's IdleInTransactionTimeout and MaxHold (tenantdb's
// Plan), an sql.Tx left idle or an sql.Conn held too long is rolled back
// and given back between two calls, as a pgx Tx or Conn is; its later calls
// fail with tenantdb.ErrIdleInTransaction or tenantdb.ErrMaxHold (and
// sql.ErrConnDone). Rows left open count as a call in progress.
//
// database/sql never keeps a connection idle here, so none can pass from one
// tenant to another inside its pool: the shared pgxpool keeps the idle
// connections, as with pgx's stdlib.OpenDBFromPool. Leave SetMaxOpenConns
// unset: the tenants' caps and the pgxpool's MaxConns bound the connections,
// and database/sql's own queue would serve tenants first come, first served
// in front of them (it works: a connection database/sql opens for a queued
// call takes that call's tenant with its first statement).
//
// This package imports only database/sql, pgx's stdlib and tenantdb: the ORM
// and the migration tool are the caller's.
package tenantsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// ErrBeginWithQuery is returned under tenantdb.ScopeTransaction by a
// QueryContext outside a transaction whose statement is BEGIN or START
// TRANSACTION: it would run inside the transaction that carries the
// tenant's values and that its rows' Close commits. Begin a transaction with
// BeginTx, or with ExecContext on an sql.Conn.
var ErrBeginWithQuery = errors.New("tenantsql: under ScopeTransaction, begin a transaction with BeginTx or ExecContext, not QueryContext")

// ErrTenantMismatch is returned by a statement run on a connection held for
// one tenant (an sql.Tx, an sql.Conn) with a context that carries another:
// it would see the first tenant's rows.
var ErrTenantMismatch = errors.New("tenantsql: statement for another tenant than the connection's")

// Option configures OpenDB and NewConnector.
type Option func(*connector)

// WithStdlibOptions passes options to pgx's stdlib connector, such as
// stdlib.OptionShouldPing. Options for connections that stdlib opens itself
// (OptionBeforeConnect, OptionAfterConnect) have no effect: connections come
// from the shared pgxpool.
func WithStdlibOptions(opts ...stdlib.OptionOpenDB) Option {
	return func(c *connector) { c.stdlibOpts = append(c.stdlibOpts, opts...) }
}

// OpenDB returns a *sql.DB whose connections are taken through p's tenant
// bulkheads. Closing it does not close p. Its idle pool is off
// (SetMaxIdleConns(0)); a connection is never reused by database/sql even if
// the idle pool is turned back on.
func OpenDB(p *tenantdb.Pool, opts ...Option) *sql.DB {
	db := sql.OpenDB(NewConnector(p, opts...))
	db.SetMaxIdleConns(0)
	return db
}

// NewConnector returns the driver.Connector OpenDB uses, for sql.OpenDB
// behind a wrapper of your own (an instrumented connector). Its connections
// report themselves invalid when database/sql would keep them, so no tenant's
// connection is ever handed to another.
func NewConnector(p *tenantdb.Pool, opts ...Option) driver.Connector {
	if p == nil {
		panic("tenantsql: a nil *tenantdb.Pool")
	}
	c := &connector{p: p}
	for _, o := range opts {
		o(c)
	}
	c.pg = stdlib.GetPoolConnector(p.Pgxpool(), c.stdlibOpts...)
	return c
}

type connector struct {
	p          *tenantdb.Pool
	pg         driver.Connector // pgx's stdlib connector over the shared pgxpool
	stdlibOpts []stdlib.OptionOpenDB
}

// Connect returns a connection for the tenant in ctx. Without a tenant (a
// Ping, or database/sql's own opener) the connection holds nothing until a
// statement brings a tenant.
func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	cn := &conn{c: c}
	if _, ok := tenantdb.TenantFrom(ctx); !ok {
		return cn, nil
	}
	if err := cn.bind(ctx); err != nil {
		return nil, err
	}
	return cn, nil
}

// Driver returns pgx's stdlib driver.
func (c *connector) Driver() driver.Driver { return c.pg.Driver() }
