package tenantdb

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// Slot is one of a tenant's slots taken without a connection, for adapters
// that get their connections from the shared pool themselves, such as
// package tenantsql (database/sql): take the Slot, acquire from
// Slot.Pgxpool with the same context (so that Config.Session sets the
// tenant's state), and give both back (Detach, Return, Release). A Slot is
// for one connection.
type Slot struct {
	permit  pool.Permit
	pg      *pgxpool.Pool // the tenant's database's with Config.Database, else the shared
	db      *dbUse        // nil without Config.Database
	g       *revokeGuard  // nil without a revocable cluster lease, nor NewServers
	calls   *inflight     // with NewServers: where g is registered under tenant, for Move
	tenant  string
	session *sessionSetup  // the Pool's, for LocalSettings
	conn    *pgconn.PgConn // Attach's
}

// Admit takes a slot for the tenant in ctx, as every Pool call does first:
// ErrNoTenant without a valid tenant, an *OverLimitError over the tenant's
// cap, ErrClosed after Close. ctx governs the wait for the slot only. The
// caller must Release the Slot on every path.
func (p *Pool) Admit(ctx context.Context) (*Slot, error) {
	permit, err := p.admit(ctx)
	if err != nil {
		return nil, err
	}
	s := &Slot{permit: permit, pg: p.pg, session: p.session}
	if p.dbs != nil || p.servers != nil {
		if s.db, err = p.use(ctx, permit); err != nil {
			permit.Release()
			return nil, err
		}
		s.pg = s.db.pg
	}
	s.tenant, _ = TenantFrom(ctx)
	_, s.g = guardRevocation(context.Background(), permit, p.calls != nil) // the connection's calls bring their own contexts
	if p.calls != nil {
		s.calls = p.calls
		s.calls.add(s.tenant, s.g)
	}
	return s, nil
}

// Pgxpool returns the pgxpool to acquire the slot's connection from: with
// Config.Database the tenant's database's, else the shared one
// (Pool.Pgxpool).
func (s *Slot) Pgxpool() *pgxpool.Pool { return s.pg }

// AcquireContext returns ctx carrying what the Pool's PrepareConn hook needs
// besides the tenant to set the slot's values under ScopeSession (its
// statement timeout, Permit.StatementTimeout): acquire the slot's connection
// from Pgxpool with it.
func (s *Slot) AcquireContext(ctx context.Context) context.Context {
	return withStatementTimeout(ctx, s.permit.StatementTimeout())
}

// Tenant returns the tenant the slot was taken for.
func (s *Slot) Tenant() string { return s.tenant }

// Session returns the Config.Session the Pool was created with, so that an
// adapter can tell whether its statements need the tenant's values set per
// transaction (ScopeTransaction).
func (p *Pool) Session() Session { return p.session.cfg }

// Attach names the connection the slot's work runs on, for LocalSettings
// and, if the tenant's cluster-wide slot is revoked (see ErrRevoked), for
// PostgreSQL to cancel the statement running on it.
func (s *Slot) Attach(c *pgconn.PgConn) {
	s.conn = c
	stateOf(c).dirty = true // the adapter runs its statements on pgx itself
	if s.g == nil {
		return
	}
	s.g.mu.Lock()
	s.g.conn = c
	s.g.mu.Unlock()
}

// Revoked reports whether the tenant's cluster-wide slot was revoked: the
// work must stop, and further statements fail with ErrRevoked.
func (s *Slot) Revoked() bool { return s.g.isRevoked() }

// Err returns nil, or the error the slot's work was stopped with, which its
// further statements fail with: ErrRevoked, or ErrMoved when Pool.Move
// ended it.
func (s *Slot) Err() error { return s.g.err() }

// Detach stops watching the attached connection, waiting for a
// CancelRequest in flight and closing the connection it was sent to: call it
// before the connection goes back to the shared pool (which destroys a closed
// one), so that no cancellation reaches its next user. It is idempotent.
func (s *Slot) Detach() { s.g.stop() }

// Return gives the slot's connection back: give returns it to
// Slot.Pgxpool (its pgxpool.Conn's Release, or database/sql's Close of a
// connection over it), and conn is its pgx.Conn. When a statement may have
// changed the session, tenantdb resets it first, as at the release of the
// Pool's own calls: on the holder's time, in a goroutine of its own, where
// give then runs; a connection whose reset fails is closed before give, and
// pgxpool destroys it. Call it after Detach and before Release. A
// connection given back otherwise is reset when it next goes to another
// tenant, on that tenant's path.
func (s *Slot) Return(conn *pgx.Conn, give func()) {
	s.session.returnConn(conn, give, s.calls.resetting(s.tenant))
}

// Release detaches the connection, if not done yet, and returns the slot to
// its tenant. Only the first call has an effect.
func (s *Slot) Release() {
	s.calls.remove(s.tenant, s.g)
	s.g.stop()
	s.permit.Release()
	s.db.done()
}

// LocalSettings returns the statement that sets the slot's tenant's values
// (Config.Session) for the current transaction on the attached connection,
// pinning the role and the search_path, as the pgx API sends with every
// statement under ScopeTransaction, for an adapter to run first in each
// transaction its statements run in. It returns "" when the Pool's Session
// is not scoped to transactions or sets nothing; its error is
// Session.SearchPath's or Session.Role's, or says that no connection of the
// Pool's pgxpool is attached.
func (s *Slot) LocalSettings() (string, error) {
	timeout := s.permit.StatementTimeout()
	if s.session.cfg.Scope != ScopeTransaction || !s.session.transactional() && timeout <= 0 {
		return "", nil
	}
	if s.conn == nil {
		return "", fmt.Errorf("tenantdb: Slot.LocalSettings before Attach")
	}
	return s.session.localStatement(s.tenant, s.conn, timeout)
}
