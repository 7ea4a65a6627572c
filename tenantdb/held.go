package tenantdb

import (
	"context"
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
	ctx, h.guard = guardRevocation(ctx, permit)
	pg := p.pg
	if p.dbs != nil {
		if h.db, err = p.dbs.use(ctx); err != nil {
			return ctx, held{}, err
		}
		pg = h.db.pg
	}
	if h.conn, err = pg.Acquire(ctx); err != nil {
		if h.db != nil {
			id, _ := TenantFrom(ctx)
			err = h.db.connectError(id, err)
		}
		return ctx, held{}, h.guard.wrap(err)
	}
	h.guard.attach(h.conn)
	if h.run, err = p.session.runner(ctx, h.conn.Conn()); err != nil {
		return ctx, held{}, err
	}
	ok = true
	return ctx, h, nil
}

// release stops the guard, returns the connection and then the slot, and
// makes *err (if err is not nil) match ErrRevoked when a revocation stopped
// the work: in that order, so that a CancelRequest in flight cannot reach
// the connection's next user (a connection one was sent to is closed, and
// pgxpool destroys it). It is idempotent, and does nothing for the
// zero held. pgxpool destroys a connection returned busy or inside a
// transaction, as after a panic in the middle of a statement.
func (h *held) release(err *error) {
	h.guard.stop()
	if h.conn != nil {
		h.conn.Release()
		h.conn = nil
	}
	h.permit.Release()
	h.db.done()
	if err != nil {
		*err = h.guard.wrap(*err)
	}
}

// maxResends bounds how often one call sends its statement again after the
// reset that travelled with it failed.
const maxResends = 3

// resend checks the reset that travelled with the statement just sent on h
// (see wireConn). It reports whether the statement must be sent again: the
// reset failed, so the server skipped the statement, and h is ready again,
// reset the slow way or on another connection. A reset fails when the
// previous holder's session made it fail (its statement_timeout, a cancel
// its timeout left pending, a server that ended the session). err is set when h cannot be readied;
// the call fails with it.
func (p *Pool) resend(ctx context.Context, h *held, attempt int) (bool, error) {
	failure := wireOf(h.conn.Conn().PgConn().Conn()).settle(ctx)
	if failure == nil {
		return false, nil
	}
	return p.recover(ctx, h, attempt, failure)
}

// recover readies h again after its connection's reset failed with failure.
func (p *Pool) recover(ctx context.Context, h *held, attempt int, failure error) (bool, error) {
	if attempt >= maxResends || ctx.Err() != nil {
		return false, h.guard.wrap(failure)
	}
	tenant, _ := TenantFrom(ctx)
	values, err := p.session.sessionValues(tenant)
	if err != nil {
		return false, err
	}
	conn := h.conn.Conn()
	if !conn.IsClosed() && slowReset(ctx, conn, tenant, values) == nil {
		return true, nil
	}
	if !conn.IsClosed() {
		closing, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(closing) // pgxpool destroys a closed connection on Release
		cancel()
	}
	h.conn.Release()
	h.conn = nil
	if h.conn, err = p.pg.Acquire(ctx); err != nil {
		return false, h.guard.wrap(err)
	}
	h.guard.attach(h.conn)
	if h.run, err = p.session.runner(ctx, h.conn.Conn()); err != nil {
		return false, err
	}
	return true, nil
}

// sendReset sends the reset armed on h's connection at once, in a round
// trip of its own, for a Conn whose statements may bypass tenantdb
// (Conn.Conn). ctx governs the round trip. The owner's values alone go with
// the Conn's first write instead, whichever way it goes (see armValues).
func (p *Pool) sendReset(ctx context.Context, h *held) error {
	if wireOf(h.conn.Conn().PgConn().Conn()).armedValuesOnly() {
		return nil
	}
	for attempt := 0; ; attempt++ {
		failure := wireOf(h.conn.Conn().PgConn().Conn()).send(ctx)
		if failure == nil {
			return nil
		}
		if again, err := p.recover(ctx, h, attempt, failure); !again {
			return err
		}
	}
}
