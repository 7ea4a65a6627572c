package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// held is what one call or Conn holds while it works: the tenant's slot, a
// shared connection, the revocation guard of the slot's cluster lease (nil
// without a revocable lease) and the runner of its statements.
type held struct {
	conn   *pgxpool.Conn
	permit pool.Permit
	guard  *revokeGuard
	run    runner
	db     *dbUse    // the tenant's database with Config.Database, else nil
	calls  *inflight // with NewServers: where the guard is registered under tenant, for Move
	tenant string
}

// hold is holdConn traced by the user's AcquireTracer. As in pgxpool, a
// panic in a hook ends the trace too, with neither connection nor error.
func (p *Pool) hold(ctx context.Context) (_ context.Context, h held, err error) {
	if p.acquireTrace == nil {
		return p.holdConn(ctx)
	}
	ctx, end := p.acquireTrace.start(ctx, p.pg)
	defer func() { end(h.conn, err) }()
	return p.holdConn(ctx)
}

// holdConn admits the tenant in ctx and acquires a shared connection for it.
// ctx governs both waits. The returned context is ctx, cancelled with
// ErrRevoked if the cluster lease is revoked: the work runs under it. On
// every failure, and on a panic in a hook, nothing stays held.
func (p *Pool) holdConn(ctx context.Context) (context.Context, held, error) {
	permit, err := p.admit(ctx)
	if err != nil {
		return ctx, held{}, err
	}
	h := held{permit: permit}
	ok := false
	defer func() {
		if !ok {
			h.release(nil)
		}
	}()
	ctx, h.guard = guardRevocation(ctx, permit, p.calls != nil)
	if p.calls != nil {
		h.calls = p.calls
		h.tenant, _ = TenantFrom(ctx)
		h.calls.add(h.tenant, h.guard)
	}
	pg := p.pg
	if p.dbs != nil || p.servers != nil {
		if h.db, err = p.use(ctx, permit); err != nil {
			return ctx, held{}, err
		}
		pg = h.db.pg
	}
	timeout := permit.StatementTimeout()
	for {
		if h.conn, err = p.session.acquire(withStatementTimeout(ctx, timeout), pg); err == nil {
			break
		}
		if h.db == nil {
			return ctx, held{}, h.guard.wrap(err)
		}
		id, _ := TenantFrom(ctx)
		err = h.db.connectError(ctx, id, err)
		set := h.db.d.replicaOf
		if set == nil || !serverDown(ctx, err) {
			return ctx, held{}, h.guard.wrap(err)
		}
		if set.fail {
			return ctx, held{}, h.guard.wrap(fmt.Errorf("%w: %w", ErrReplicaUnavailable, err))
		}
		// The replica is known down now: the read goes to another, or to
		// the primary.
		h.db.done()
		if h.db, err = p.use(ctx, permit); err != nil {
			return ctx, held{}, err
		}
		pg = h.db.pg
	}
	h.guard.attach(h.conn)
	if h.run, err = p.session.runner(ctx, h.conn.Conn(), timeout); err != nil {
		return ctx, held{}, err
	}
	ok = true
	return ctx, h, nil
}

// admit takes a slot for the tenant in ctx.
func (p *Pool) admit(ctx context.Context) (pool.Permit, error) {
	id, ok := TenantFrom(ctx)
	if !ok {
		return pool.Permit{}, errNoTenantInContext
	}
	permit, err := p.gate.Acquire(ctx, id)
	if err != nil && errors.Is(err, pool.ErrInvalidTenant) {
		return pool.Permit{}, fmt.Errorf("%w: %w", ErrNoTenant, err)
	}
	return permit, err
}

// timeoutKey is the context key under which hold passes a permit's
// statement timeout to the PrepareConn hook.
type timeoutKey struct{}

// withStatementTimeout returns ctx carrying d for prepare, or ctx itself
// when d is 0, so that calls without a timeout allocate nothing for it.
func withStatementTimeout(ctx context.Context, d time.Duration) context.Context {
	if d <= 0 {
		return ctx
	}
	return context.WithValue(ctx, timeoutKey{}, d)
}

// statementTimeoutFrom returns the timeout withStatementTimeout put in ctx.
func statementTimeoutFrom(ctx context.Context) time.Duration {
	d, _ := ctx.Value(timeoutKey{}).(time.Duration)
	return d
}

// release stops the guard, returns the connection and then the slot, and
// makes *err (if err is not nil) match ErrRevoked when a revocation stopped
// the work: in that order, so that a CancelRequest in flight cannot reach
// the connection's next user (a connection one was sent to is closed, and
// pgxpool destroys it). It is idempotent, and does nothing for the
// zero held. pgxpool destroys a connection returned busy or inside a
// transaction, as after a panic in the middle of a statement.
func (h *held) release(err *error) {
	h.calls.remove(h.tenant, h.guard)
	h.guard.stop()
	if h.conn != nil {
		h.run.setup.release(h.conn, h.run.st, h.calls.resetting(h.tenant))
		h.conn = nil
	}
	if err != nil {
		countStatementTimeout(h.permit, *err) // while the permit is held
	}
	h.permit.Release()
	h.permit = pool.Permit{} // a second release (a deferred Rollback after Commit) reads no recycled permit
	h.db.done()
	if err != nil {
		*err = h.guard.wrap(*err)
	}
}
