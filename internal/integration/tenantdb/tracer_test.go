package tenantdb_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// userTracer stands for a tracer a service already has (otelpgx, tracelog).
type userTracer struct{ queries atomic.Int64 }

func (u *userTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	u.queries.Add(1)
	return ctx
}
func (u *userTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// ourTracer is what Config.Tracer gets: admissions and queries.
type ourTracer struct {
	admissions, queries atomic.Int64
	tenants             atomic.Value
}

func (o *ourTracer) TraceAcquireStart(ctx context.Context, _ *pool.Gate, _ pool.TraceAcquireStartData) context.Context {
	return ctx
}
func (o *ourTracer) TraceAcquireEnd(context.Context, *pool.Gate, pool.TraceAcquireEndData) {
	o.admissions.Add(1)
}
func (o *ourTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	o.queries.Add(1)
	if id, ok := tenantdb.TenantFrom(ctx); ok {
		o.tenants.Store(id)
	}
	return ctx
}
func (o *ourTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestUserTracerKeepsWorkingAlongsideOurs(t *testing.T) {
	user, ours := &userTracer{}, &ourTracer{}
	cfg := pgxConfig(t, sharedPG, 2)
	cfg.ConnConfig.Tracer = user
	p, err := tenantdb.New(context.Background(), cfg, tenantdb.Config{Tracer: ours})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Exec(as("acme"), "select 1"); err != nil {
		t.Fatal(err)
	}
	if user.queries.Load() == 0 {
		t.Error("the user's own pgx tracer saw no query")
	}
	if ours.queries.Load() == 0 || ours.admissions.Load() != 1 {
		t.Errorf("our tracer saw %d queries and %d admissions", ours.queries.Load(), ours.admissions.Load())
	}
	if got, _ := ours.tenants.Load().(string); got != "acme" {
		t.Errorf("query tracer saw tenant %q, want acme from the context", got)
	}
	if cfg.ConnConfig.Tracer != user {
		t.Error("New changed the caller's pgxpool.Config")
	}
}
