package tracing_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
)

// TestClassOnSpansAndMetrics: a request of a named class carries ClassKey on
// its admission span (a default-class one does not), and the per-class
// metrics report each class's connections, waiters, share and admissions.
func TestClassOnSpansAndMetrics(t *testing.T) {
	e := newEnv(t)
	g := newGate(t, e.tr, pool.Config{
		Capacity: 4,
		Plans:    map[string]pool.Plan{"std": {MaxConns: 4}},
		Classes:  map[string]pool.Class{"batch": {MaxConns: 1, MaxWaiting: 5, MaxShare: 0.5}},
	})
	stop, err := e.tr.ObserveGate(g)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx, root := e.root(context.Background())
	batch := pool.WithClass(ctx, "batch")
	b := mustAcquire(t, batch, g, "a")
	waiter := acquireAsync(batch, g, "a")
	tenantdbtest.Eventually(t, probeTimeout, "a batch request waits", tenantWaiting(g, "a", 1))
	i := mustAcquire(t, ctx, g, "a")

	rm := e.collect(t)
	cls := func(name string) attribute.KeyValue { return tracing.ClassKey.String(name) }
	for _, c := range []struct {
		name string
		want float64
		attr []attribute.KeyValue
	}{
		{"tenantdb.class.connection.count", 1, []attribute.KeyValue{cls("batch")}},
		{"tenantdb.class.connection.count", 1, []attribute.KeyValue{cls("default")}},
		{"tenantdb.class.connection.pending_requests", 1, []attribute.KeyValue{cls("batch")}},
		{"tenantdb.class.connection.max", 2, []attribute.KeyValue{cls("batch")}},
		{"tenantdb.class.connection.admissions", 1, []attribute.KeyValue{cls("batch"), tracing.OutcomeKey.String("acquired")}},
	} {
		if got := value(t, rm, c.name, c.attr...).value; got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.attr, got, c.want)
		}
	}
	b.Release()
	recv(t, waiter).p.Release()
	i.Release()
	root.End()

	var batchSpans, defaultSpans int
	for _, s := range e.ended(tracing.AcquireSpanName) {
		if v, ok := attr(s, tracing.ClassKey); ok {
			if v.AsString() != "batch" {
				t.Errorf("class attribute %q", v.AsString())
			}
			batchSpans++
		} else {
			defaultSpans++
		}
	}
	if batchSpans != 2 || defaultSpans != 1 {
		t.Fatalf("%d spans with class batch, %d without, want 2 and 1", batchSpans, defaultSpans)
	}
}
