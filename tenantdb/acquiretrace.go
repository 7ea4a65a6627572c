package tenantdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// acquireTrace calls the user's pgx AcquireTracer (a pgxpool.Config's
// ConnConfig.Tracer that implements pgxpool.AcquireTracer) around the whole
// of a tenant's acquire, the tenant gate's wait and its refusals included,
// as pgxpool calls it around its own acquire. pgxpool still holds the
// tracer, wrapped: an acquire tenantdb traces is marked in its context, and
// the wrapper then leaves Start to tenantdb and hands End the context the
// user's Start returned. Acquires tenantdb does not trace (Slot users', its
// own maintenance) reach the user's tracer from pgxpool as before.
type acquireTrace struct {
	user pgxpool.AcquireTracer
}

// acquireMark is the mark of one traced acquire in its context.
type acquireMark struct {
	trace *acquireTrace
	ctx   context.Context // the user's Start returned it
	ended bool
}

type acquireMarkKey struct{}

// hookAcquireTracer wraps the user's AcquireTracer in cfg, if there is one,
// so that tenantdb can trace its tenants' acquires with it, and returns the
// trace (nil without one). Call it before the config's tracer is chained
// with tenantdb's own.
func hookAcquireTracer(cfg *pgx.ConnConfig) *acquireTrace {
	user, ok := cfg.Tracer.(pgxpool.AcquireTracer)
	if !ok {
		return nil
	}
	t := &acquireTrace{user: user}
	chain := chainTracers(cfg.Tracer, nil)
	chain.userAcquire = markedAcquire{t}
	cfg.Tracer = chain
	return t
}

// start calls the user's TraceAcquireStart and returns ctx marked, for the
// acquire to run under, and end, to call with the acquire's outcome.
func (t *acquireTrace) start(ctx context.Context, pg *pgxpool.Pool) (context.Context, func(c *pgxpool.Conn, err error)) {
	if t == nil {
		return ctx, func(*pgxpool.Conn, error) {}
	}
	m := &acquireMark{trace: t, ctx: t.user.TraceAcquireStart(ctx, pg, pgxpool.TraceAcquireStartData{})}
	return context.WithValue(ctx, acquireMarkKey{}, m), func(c *pgxpool.Conn, err error) {
		if m.ended {
			return
		}
		m.ended = true
		var conn *pgx.Conn
		if c != nil {
			conn = c.Conn()
		}
		t.user.TraceAcquireEnd(m.ctx, pg, pgxpool.TraceAcquireEndData{Conn: conn, Err: err})
	}
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

// markedAcquire is the user's AcquireTracer as pgxpool calls it: unchanged
// for an unmarked acquire; for one tenantdb traces, only the first End,
// with the context of tenantdb's Start.
type markedAcquire struct{ t *acquireTrace }

func (a markedAcquire) mark(ctx context.Context) *acquireMark {
	if m, ok := ctx.Value(acquireMarkKey{}).(*acquireMark); ok && m.trace == a.t {
		return m
	}
	return nil
}

func (a markedAcquire) TraceAcquireStart(ctx context.Context, pg *pgxpool.Pool, d pgxpool.TraceAcquireStartData) context.Context {
	if a.mark(ctx) != nil {
		return ctx
	}
	return a.t.user.TraceAcquireStart(ctx, pg, d)
}

func (a markedAcquire) TraceAcquireEnd(ctx context.Context, pg *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	m := a.mark(ctx)
	if m == nil {
		a.t.user.TraceAcquireEnd(ctx, pg, d)
		return
	}
	if !m.ended {
		m.ended = true
		a.t.user.TraceAcquireEnd(m.ctx, pg, d)
	}
}
