package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// ErrRevoked is matched by the error of a statement stopped because its
// tenant's cluster-wide slot was revoked while it ran (see
// pool.ClusterLease: pool/redislimit in FailClosed mode revokes a lease
// it can no longer vouch for, as when this process was cut off from Redis
// for longer than the lease lives), and of every later use of that Conn.
// The slot may already be another process's: the work must stop.
// Exec, Query, QueryRow, SendBatch, CopyFrom, Begin (and the transaction's
// Exec, Query and QueryRow) and Conn honour it.
var ErrRevoked = errors.New("tenantdb: the tenant's cluster slot was revoked")

// cancelRequestTimeout bounds the CancelRequest sent on revocation.
const cancelRequestTimeout = 5 * time.Second

// closeCancelledTimeout bounds the close of a connection a revocation's
// CancelRequest was sent to.
const closeCancelledTimeout = time.Second

// revokeGuard stops the work of one admission when its cluster lease is
// revoked: it asks PostgreSQL to cancel the statement running on the
// admission's connection (closing the socket alone would leave the backend
// running its statement), and cancels the context the work runs under, so
// that no further statement starts.
type revokeGuard struct {
	cancel context.CancelCauseFunc
	stopc  chan struct{} // closed by stop
	once   sync.Once

	mu         sync.Mutex
	conn       *pgconn.PgConn // guarded by mu: the admission's connection, nil once detached
	revoked    bool           // guarded by mu
	cause      error          // guarded by mu: ErrRevoked, or ErrMoved for a move's end
	cancelling chan struct{}  // guarded by mu: closed when the CancelRequest is done; nil if none
	cancelled  *pgconn.PgConn // guarded by mu: the connection the CancelRequest was sent to

	// calls, with NewServers, is where the guard is registered under
	// tenant, for Move (see register); set before the guard is shared.
	calls  *inflight
	tenant string
}

// guardRevocation returns ctx, cancelled with ErrRevoked when permit's
// lease is revoked, and the guard; without a revocable lease it returns ctx
// and nil, at no cost.
// With always (a Pool of NewServers, whose Move may end the work), it
// returns a guard without a lease too, which only revoke ends.
func guardRevocation(ctx context.Context, permit pool.Permit, always bool) (context.Context, *revokeGuard) {
	rev := permit.Revoked()
	if rev == nil && !always {
		return ctx, nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	g := &revokeGuard{cancel: cancel, stopc: make(chan struct{})}
	if rev != nil {
		go g.watch(rev)
	}
	return ctx, g
}

func (g *revokeGuard) watch(rev <-chan struct{}) {
	select {
	case <-rev:
	case <-g.stopc:
		return
	}
	g.revoke(ErrRevoked)
}

// register records the guard under tenant in calls, so that Move can end
// the admission's work; unregister undoes it.
func (g *revokeGuard) register(calls *inflight, tenant string) {
	g.calls, g.tenant = calls, tenant
	calls.add(tenant, g)
}

func (g *revokeGuard) unregister() {
	if g != nil {
		g.calls.remove(g.tenant, g)
	}
}

// resetting is calls.resetting of the tenant the guard is registered
// under: nil without NewServers.
func (g *revokeGuard) resetting() func() func() {
	if g == nil {
		return nil
	}
	return g.calls.resetting(g.tenant)
}

// revoke stops the admission's work: a CancelRequest for the statement
// running on its connection, and its context cancelled with cause, which
// its errors then match. Only the first call has an effect.
func (g *revokeGuard) revoke(cause error) {
	g.mu.Lock()
	if g.revoked {
		g.mu.Unlock()
		return
	}
	conn := g.conn
	g.revoked, g.cause = true, cause
	var done chan struct{}
	if conn != nil {
		done = make(chan struct{})
		g.cancelling, g.cancelled = done, conn
	}
	g.mu.Unlock()
	if conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), cancelRequestTimeout)
		_ = conn.CancelRequest(ctx) // best effort: the context below stops the rest
		cancel()
		close(done)
	}
	g.cancel(cause)
}

// serverPID is the process ID the server gave the admission's connection,
// 0 if it has none now.
func (g *revokeGuard) serverPID() uint32 {
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn == nil {
		return 0
	}
	return g.conn.PID()
}

// attach names the connection the admission runs on.
func (g *revokeGuard) attach(c *pgxpool.Conn) {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.conn = c.Conn().PgConn()
	g.mu.Unlock()
}

// stop ends the guard before its connection goes back to the pool: it waits
// for a CancelRequest in flight, then closes the connection it was sent to,
// so that pgxpool destroys it. PostgreSQL may act on a cancel after
// CancelRequest returned (pgx does not report one the server never
// acknowledged), and it must not reach the statement of the connection's
// next user. It is idempotent.
func (g *revokeGuard) stop() { g.end(true) }

// stopKeeping is stop for a connection that leaves the pool (Hijack): it
// stays open, as its new owner is the revoked admission's caller.
func (g *revokeGuard) stopKeeping() { g.end(false) }

func (g *revokeGuard) end(closeCancelled bool) {
	if g == nil {
		return
	}
	g.once.Do(func() {
		close(g.stopc)
		g.mu.Lock()
		g.conn = nil
		done, cancelled := g.cancelling, g.cancelled
		g.mu.Unlock()
		if done != nil {
			<-done
		}
		if cancelled != nil && closeCancelled && !cancelled.IsClosed() {
			ctx, cancel := context.WithTimeout(context.Background(), closeCancelledTimeout)
			_ = cancelled.Close(ctx)
			cancel()
		}
		g.cancel(context.Canceled)
	})
}

// err returns nil, or the cause the admission's work was stopped with:
// ErrRevoked, or ErrMoved.
func (g *revokeGuard) err() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.revoked {
		return nil
	}
	return g.cause
}

// isRevoked reports whether the lease was revoked.
func (g *revokeGuard) isRevoked() bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.revoked
}

// wrap makes err, from work stopped by a revocation, match its cause:
// ErrRevoked, or ErrMoved.
func (g *revokeGuard) wrap(err error) error {
	err = statementTimedOut(err)
	if err == nil || g == nil || !g.isRevoked() {
		return err
	}
	g.mu.Lock()
	cause := g.cause
	g.mu.Unlock()
	if errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w: %w", cause, err)
}
