package tracing_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// otelpgxScope is the instrumentation scope of otelpgx's spans.
const otelpgxScope = "github.com/exaring/otelpgx"

// TestComposesWithOtelpgx chains otelpgx itself, which ends
// trace.SpanFromContext(ctx), before the Tracer (issue 33 item 3): every span
// otelpgx starts is ended, each of our query spans nests under one of its
// spans, and ours are ended too.
func TestComposesWithOtelpgx(t *testing.T) {
	e := newEnv(t)
	own := otelpgx.NewTracer(otelpgx.WithTracerProvider(e.tp))
	p := newTracedPool(t, e.tr, own, 2, tenantdb.Config{})
	ctx, root := e.root(tenantdb.WithTenant(context.Background(), "acme"))
	for i := range 3 {
		if _, err := p.Exec(ctx, fmt.Sprintf("select %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	b := &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("select 2")
	if err := p.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	root.End()

	ended := map[[8]byte]sdktrace.ReadOnlySpan{}
	for _, s := range e.spans.Ended() {
		ended[s.SpanContext().SpanID()] = s
	}
	theirs := 0
	for _, s := range e.spans.Started() {
		if s.InstrumentationScope().Name != otelpgxScope {
			continue
		}
		theirs++
		if _, ok := ended[s.SpanContext().SpanID()]; !ok {
			t.Errorf("otelpgx's span %q was never ended", s.Name())
		}
	}
	if theirs < 4 {
		t.Fatalf("otelpgx started %d spans, want one per Exec and one for the batch at least", theirs)
	}
	ours := e.ended("SELECT " + postgres(t).Database)
	if len(ours) != 3 {
		t.Fatalf("%d of our query spans ended, want 3", len(ours))
	}
	for i, s := range ours {
		parent, ok := ended[s.Parent().SpanID()]
		if !ok || parent.InstrumentationScope().Name != otelpgxScope {
			t.Errorf("query %d: our span's parent is not an ended otelpgx span", i)
		}
	}
}
