package tenantdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tracerChain runs the pgx tracer already in the pgxpool.Config (the user's,
// otelpgx say) around Config.Tracer's: the user's starts first and ends
// last, and each End gets the context its own Start returned. pgx hands one
// context from Start to End, so the user's is kept inside ours; a tracer that
// ends trace.SpanFromContext(ctx), as otelpgx does, then ends its own span,
// not ours. pgx's multitracer passes both the last tracer's context instead.
type tracerChain struct {
	userQuery, ourQuery     pgx.QueryTracer
	userBatch, ourBatch     pgx.BatchTracer
	userCopy, ourCopy       pgx.CopyFromTracer
	userPrepare, ourPrepare pgx.PrepareTracer
	userConnect, ourConnect pgx.ConnectTracer
	userAcquire, ourAcquire pgxpool.AcquireTracer
	userRelease, ourRelease pgxpool.ReleaseTracer
}

func chainTracers(user, ours pgx.QueryTracer) *tracerChain {
	c := &tracerChain{userQuery: user, ourQuery: ours}
	c.userBatch, _ = user.(pgx.BatchTracer)
	c.ourBatch, _ = ours.(pgx.BatchTracer)
	c.userCopy, _ = user.(pgx.CopyFromTracer)
	c.ourCopy, _ = ours.(pgx.CopyFromTracer)
	c.userPrepare, _ = user.(pgx.PrepareTracer)
	c.ourPrepare, _ = ours.(pgx.PrepareTracer)
	c.userConnect, _ = user.(pgx.ConnectTracer)
	c.ourConnect, _ = ours.(pgx.ConnectTracer)
	c.userAcquire, _ = user.(pgxpool.AcquireTracer)
	c.ourAcquire, _ = ours.(pgxpool.AcquireTracer)
	c.userRelease, _ = user.(pgxpool.ReleaseTracer)
	c.ourRelease, _ = ours.(pgxpool.ReleaseTracer)
	return c
}

// userCtxKey keys the user's tracer context of one kind of call inside ours.
type userCtxKey struct{ kind uint8 }

const (
	queryCall uint8 = iota
	batchCall
	copyCall
	prepareCall
	connectCall
	acquireCall
)

// keepUser returns ours carrying user, the context the user's tracer
// returned, for its End. When our tracer added nothing, ours is user.
func keepUser(ours, user context.Context, kind uint8) context.Context {
	if ours == user {
		return ours
	}
	return context.WithValue(ours, userCtxKey{kind}, user)
}

// userCtx returns the context the user's tracer returned at Start.
func userCtx(ctx context.Context, kind uint8) context.Context {
	if u, ok := ctx.Value(userCtxKey{kind}).(context.Context); ok {
		return u
	}
	return ctx
}

// chainStart runs user's Start, then ours on the context user returned.
func chainStart[T any](ctx context.Context, kind uint8, user, ours T, start func(T, context.Context) context.Context) context.Context {
	if any(user) != nil {
		ctx = start(user, ctx)
	}
	if any(ours) == nil {
		return ctx
	}
	return keepUser(start(ours, ctx), ctx, kind)
}

// chainEnd runs our End, then user's with the context it returned at Start.
func chainEnd[T any](ctx context.Context, kind uint8, user, ours T, end func(T, context.Context)) {
	if any(ours) != nil {
		end(ours, ctx)
	}
	if any(user) != nil {
		end(user, userCtx(ctx, kind))
	}
}

func (c *tracerChain) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return chainStart(ctx, queryCall, c.userQuery, c.ourQuery, func(t pgx.QueryTracer, ctx context.Context) context.Context {
		return t.TraceQueryStart(ctx, conn, d)
	})
}

func (c *tracerChain) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	chainEnd(ctx, queryCall, c.userQuery, c.ourQuery, func(t pgx.QueryTracer, ctx context.Context) {
		t.TraceQueryEnd(ctx, conn, d)
	})
}

func (c *tracerChain) TraceBatchStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	return chainStart(ctx, batchCall, c.userBatch, c.ourBatch, func(t pgx.BatchTracer, ctx context.Context) context.Context {
		return t.TraceBatchStart(ctx, conn, d)
	})
}

func (c *tracerChain) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchQueryData) {
	chainEnd(ctx, batchCall, c.userBatch, c.ourBatch, func(t pgx.BatchTracer, ctx context.Context) {
		t.TraceBatchQuery(ctx, conn, d)
	})
}

func (c *tracerChain) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchEndData) {
	chainEnd(ctx, batchCall, c.userBatch, c.ourBatch, func(t pgx.BatchTracer, ctx context.Context) {
		t.TraceBatchEnd(ctx, conn, d)
	})
}

func (c *tracerChain) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	return chainStart(ctx, copyCall, c.userCopy, c.ourCopy, func(t pgx.CopyFromTracer, ctx context.Context) context.Context {
		return t.TraceCopyFromStart(ctx, conn, d)
	})
}

func (c *tracerChain) TraceCopyFromEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceCopyFromEndData) {
	chainEnd(ctx, copyCall, c.userCopy, c.ourCopy, func(t pgx.CopyFromTracer, ctx context.Context) {
		t.TraceCopyFromEnd(ctx, conn, d)
	})
}

func (c *tracerChain) TracePrepareStart(ctx context.Context, conn *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	return chainStart(ctx, prepareCall, c.userPrepare, c.ourPrepare, func(t pgx.PrepareTracer, ctx context.Context) context.Context {
		return t.TracePrepareStart(ctx, conn, d)
	})
}

func (c *tracerChain) TracePrepareEnd(ctx context.Context, conn *pgx.Conn, d pgx.TracePrepareEndData) {
	chainEnd(ctx, prepareCall, c.userPrepare, c.ourPrepare, func(t pgx.PrepareTracer, ctx context.Context) {
		t.TracePrepareEnd(ctx, conn, d)
	})
}

func (c *tracerChain) TraceConnectStart(ctx context.Context, d pgx.TraceConnectStartData) context.Context {
	return chainStart(ctx, connectCall, c.userConnect, c.ourConnect, func(t pgx.ConnectTracer, ctx context.Context) context.Context {
		return t.TraceConnectStart(ctx, d)
	})
}

func (c *tracerChain) TraceConnectEnd(ctx context.Context, d pgx.TraceConnectEndData) {
	chainEnd(ctx, connectCall, c.userConnect, c.ourConnect, func(t pgx.ConnectTracer, ctx context.Context) {
		t.TraceConnectEnd(ctx, d)
	})
}

func (c *tracerChain) TraceAcquireStart(ctx context.Context, p *pgxpool.Pool, d pgxpool.TraceAcquireStartData) context.Context {
	return chainStart(ctx, acquireCall, c.userAcquire, c.ourAcquire, func(t pgxpool.AcquireTracer, ctx context.Context) context.Context {
		return t.TraceAcquireStart(ctx, p, d)
	})
}

func (c *tracerChain) TraceAcquireEnd(ctx context.Context, p *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	chainEnd(ctx, acquireCall, c.userAcquire, c.ourAcquire, func(t pgxpool.AcquireTracer, ctx context.Context) {
		t.TraceAcquireEnd(ctx, p, d)
	})
}

func (c *tracerChain) TraceRelease(p *pgxpool.Pool, d pgxpool.TraceReleaseData) {
	if c.ourRelease != nil {
		c.ourRelease.TraceRelease(p, d)
	}
	if c.userRelease != nil {
		c.userRelease.TraceRelease(p, d)
	}
}
