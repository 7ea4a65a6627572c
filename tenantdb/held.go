package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
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
	db     *dbUse // the tenant's database with Config.Database, else nil
}

// hold is holdConn traced by the user's AcquireTracer. As in pgxpool, a
// panic in a hook ends the trace too, with neither connection nor error.
// It fills *h in place (h is the caller's zero held), so that the held
// state is not copied on its way out: on a failure *h stays zero.
func (p *Pool) hold(ctx context.Context, h *held) (_ context.Context, err error) {
	if p.acquireTrace == nil {
		return p.holdConn(ctx, h)
	}
	ctx, end := p.acquireTrace.start(ctx, p.pg)
	defer func() { end(h.conn, err) }()
	return p.holdConn(ctx, h)
}

// holdConn admits the tenant in ctx and acquires a shared connection for it,
// into *h. ctx governs both waits. The returned context is ctx, cancelled
// with ErrRevoked if the cluster lease is revoked: the work runs under it.
// On every failure, and on a panic in a hook, nothing stays held and *h is
// zero.
func (p *Pool) holdConn(ctx context.Context, h *held) (context.Context, error) {
	permit, err := p.admit(ctx)
	if err != nil {
		return ctx, err
	}
	h.permit = permit
	ok := false
	defer func() {
		if !ok {
			h.release(nil)
			*h = held{}
		}
	}()
	ctx, h.guard = guardRevocation(ctx, permit, p.calls != nil)
	if p.calls != nil {
		tenant, _ := TenantFrom(ctx)
		h.guard.register(p.calls, tenant)
	}
	pg := p.pg
	if p.dbs != nil || p.servers != nil {
		if h.db, err = p.use(ctx, permit); err != nil {
			return ctx, err
		}
		pg = h.db.pg
	}
	timeout := permit.StatementTimeout()
	for {
		if h.conn, err = p.session.acquire(withStatementTimeout(ctx, timeout), pg); err == nil {
			break
		}
		if h.db == nil {
			return ctx, h.guard.wrap(err)
		}
		id, _ := TenantFrom(ctx)
		err = h.db.connectError(ctx, id, err)
		set := h.db.d.replicaOf
		if set == nil || !serverDown(ctx, err) {
			return ctx, h.guard.wrap(err)
		}
		if set.fail {
			return ctx, h.guard.wrap(fmt.Errorf("%w: %w", ErrReplicaUnavailable, err))
		}
		// The replica is known down now: the read goes to another, or to
		// the primary.
		h.db.done()
		if h.db, err = p.use(ctx, permit); err != nil {
			return ctx, err
		}
		pg = h.db.pg
	}
	h.guard.attach(h.conn)
	if err = p.session.runner(ctx, h.conn.Conn(), timeout, &h.run); err != nil {
		return ctx, err
	}
	ok = true
	return ctx, nil
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

// timeoutsUsed is set by the first withStatementTimeout that puts a
// timeout in a context: until then prepare need not walk a context's chain
// to find none.
var timeoutsUsed atomic.Bool

// withStatementTimeout returns ctx carrying d for prepare, or ctx itself
// when d is 0, so that calls without a timeout allocate nothing for it.
func withStatementTimeout(ctx context.Context, d time.Duration) context.Context {
	if d <= 0 {
		return ctx
	}
	if !timeoutsUsed.Load() {
		timeoutsUsed.Store(true) // before the context exists
	}
	return context.WithValue(ctx, timeoutKey{}, d)
}

// statementTimeoutFrom returns the timeout withStatementTimeout put in ctx.
func statementTimeoutFrom(ctx context.Context) time.Duration {
	if !timeoutsUsed.Load() {
		return 0
	}
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
	h.guard.unregister()
	h.guard.stop()
	if h.conn != nil {
		var setup *sessionSetup // nil (a plain release) if no runner was made
		if h.run.st != nil {
			setup = h.run.st.setup
		}
		setup.release(h.conn, h.run.st, h.guard.resetting())
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
