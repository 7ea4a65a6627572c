package tenantdb

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/pool"
)

var (
	// ErrOverLimit is matched by every *OverLimitError: the tenant was at its
	// cap and its queue was full, or it waited its plan's MaxWait.
	ErrOverLimit = pool.ErrOverLimit

	// ErrClosed is returned by every call after Close.
	ErrClosed = pool.ErrClosed

	// ErrUnknownClass is returned (wrapped) by a call whose context names a
	// class (WithClass) that is not one of Config.Classes, or a malformed one.
	ErrUnknownClass = pool.ErrUnknownClass
)

// OverLimitError reports a request refused because its tenant is at its cap.
// Its Tenant, Limit and RetryAfter fields say who, at what cap and when to come
// back; WriteOverLimit turns it into HTTP 429 with Retry-After.
type OverLimitError = pool.OverLimitError

// WaitError reports a call whose context ended while it waited for a
// connection: its Stage says where it waited, and errors.Is matches it with
// the context's error (context.DeadlineExceeded or context.Canceled).
type WaitError = pool.WaitError

// Stage names where a call waited for a connection (WaitError.Stage).
type Stage = pool.Stage

const (
	// StageTenant is the wait in the tenant's own queue, for a slot under its cap.
	StageTenant = pool.StageTenant
	// StageCluster is the wait for a cluster-wide slot (Config.Cluster).
	StageCluster = pool.StageCluster
	// StageShared is the wait for the pool's shared capacity.
	StageShared = pool.StageShared
)

// ErrConnReleased is returned by every use of a Conn after its Release (or
// Hijack), of any copy of it, and of the Tx, Rows, Row and BatchResults it
// handed out: the connection may be another holder's by then. The zero
// Conn returns it too.
var ErrConnReleased = errors.New("tenantdb: the Conn was released")

// ErrRoleDefaultsChanged fails the opening of a connection whose login role
// or database has other default settings (ALTER ROLE ... [IN DATABASE ...]
// SET, ALTER DATABASE ... SET) than the Pool's first connection to its
// server found for that database (it reads those of every database there;
// with NewServers each server is read on its own): a session can change
// its own role's defaults, in any database, for every session opened after
// it, and no reset undoes them. The error names the database and the
// settings. Put them back (ALTER ROLE ... RESET) and new connections open
// again; or, for a change that is meant, start the process again.
var ErrRoleDefaultsChanged = errors.New("tenantdb: the login role's or database's default settings changed since the Pool's first connection to the server")

// ErrCannotRunInTransaction is matched, together with PostgreSQL's own
// error (SQLSTATE 25001), by a statement that cannot run inside a
// transaction block (CREATE INDEX CONCURRENTLY, DROP INDEX CONCURRENTLY,
// VACUUM, CREATE DATABASE) sent under ScopeTransaction, which runs every
// statement in a transaction that carries the tenant's settings. Nothing of
// the call ran. Run such statements on Pool.Pgxpool (no tenant, names
// qualified with their schema) or on a Pool with ScopeSession.
var ErrCannotRunInTransaction = errors.New("tenantdb: the statement cannot run inside a transaction block, " +
	"and ScopeTransaction runs every statement in one: run it through Pool.Pgxpool (on no tenant's behalf, " +
	"with schema-qualified names) or with ScopeSession")

// ErrStatementTimeout is matched, together with PostgreSQL's own error
// (SQLSTATE 57014), by a statement that ran longer than its tenant's
// statement timeout (pool.Plan.StatementTimeout, pool.Tenant's, a class's)
// and was cancelled by the server. The call's slot is back when it returns.
var ErrStatementTimeout = errors.New("tenantdb: the statement ran past its tenant's statement timeout")

// statementTimedOut makes err match ErrStatementTimeout when the server
// cancelled a statement for its statement_timeout: SQLSTATE 57014 is also a
// cancellation by request (a context), which the message tells apart.
func statementTimedOut(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "57014" ||
		!strings.Contains(pgErr.Message, "statement timeout") || errors.Is(err, ErrStatementTimeout) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStatementTimeout, err)
}
