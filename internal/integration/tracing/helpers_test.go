package tracing_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tracing"
)

// env is a Tracer wired to in-memory span and metric readers.
type env struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	tr     *tracing.Tracer
}

func newEnv(t testing.TB, opts ...tracing.Option) *env {
	t.Helper()
	e := &env{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	e.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() {
		_ = e.tp.Shutdown(context.Background())
		_ = e.mp.Shutdown(context.Background())
	})
	e.tr = tracing.New(append([]tracing.Option{
		tracing.WithTracerProvider(e.tp), tracing.WithMeterProvider(e.mp),
	}, opts...)...)
	return e
}

// root starts a recording span standing for the caller's request.
func (e *env) root(ctx context.Context) (context.Context, trace.Span) {
	return e.tp.Tracer("test").Start(ctx, "request")
}

func (e *env) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func (e *env) collect(t testing.TB) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect: %v", err)
	}
	return rm
}

// metricNamed returns the metric called name, and false when it has no data.
func metricNamed(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// point is one data point reduced to what tests compare.
type point struct {
	attrs attribute.Set
	value float64 // sum or gauge value; for histograms the count
	sum   float64 // histograms only
	hist  metricdata.HistogramDataPoint[float64]
}

func points(t testing.TB, rm metricdata.ResourceMetrics, name string) []point {
	t.Helper()
	m, ok := metricNamed(rm, name)
	if !ok {
		return nil
	}
	var out []point
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, point{attrs: p.Attributes, value: float64(p.Value)})
		}
	case metricdata.Sum[float64]:
		for _, p := range d.DataPoints {
			out = append(out, point{attrs: p.Attributes, value: p.Value})
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out = append(out, point{attrs: p.Attributes, value: float64(p.Value)})
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			out = append(out, point{attrs: p.Attributes, value: p.Value})
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, point{attrs: p.Attributes, value: float64(p.Count), sum: p.Sum, hist: p})
		}
	default:
		t.Fatalf("%s: unexpected data %T", name, m.Data)
	}
	return out
}

// value returns the point of name whose attributes include all of want,
// failing when there is not exactly one.
func value(t testing.TB, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) point {
	t.Helper()
	var found []point
	for _, p := range points(t, rm, name) {
		if hasAll(p.attrs, want) {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s%v: %d points, want 1; all: %v", name, want, len(found), points(t, rm, name))
	}
	return found[0]
}

func hasAll(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func mustAttr(t testing.TB, s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	t.Helper()
	v, ok := attr(s, key)
	if !ok {
		t.Fatalf("span %q has no %s; attributes: %v", s.Name(), key, s.Attributes())
	}
	return v
}

func newGate(t testing.TB, tr pool.AcquireTracer, cfg pool.Config) *pool.Gate {
	t.Helper()
	cfg.Tracer = tr
	g, err := pool.New(cfg)
	if err != nil {
		t.Fatalf("pool.New: %v", err)
	}
	t.Cleanup(g.Close)
	return g
}

func mustAcquire(t testing.TB, ctx context.Context, g *pool.Gate, id string) pool.Permit {
	t.Helper()
	p, err := g.Acquire(ctx, id)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", id, err)
	}
	return p
}

// probeTimeout bounds a test's wait for the Gate's state (a waiter queued,
// a result delivered); it matters only when the test fails.
const probeTimeout = 20 * time.Second

type result struct {
	p   pool.Permit
	err error
}

func acquireAsync(ctx context.Context, g *pool.Gate, id string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		p, err := g.Acquire(ctx, id)
		ch <- result{p, err}
	}()
	return ch
}

func recv(t testing.TB, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(probeTimeout):
		t.Fatalf("no result after %v", probeTimeout)
		return result{}
	}
}

// batchAndCopy sends a batch of two inserts into table, a one-column table
// of ints, then copies a row into it: one call of each kind.
func batchAndCopy(t testing.TB, ctx context.Context, p *tenantdb.Pool, table string) {
	t.Helper()
	b := &pgx.Batch{}
	b.Queue("insert into " + table + " values (1)")
	b.Queue("insert into " + table + " values (2)")
	if err := p.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CopyFrom(ctx, pgx.Identifier{table}, []string{"n"}, pgx.CopyFromRows([][]any{{3}})); err != nil {
		t.Fatal(err)
	}
}

func tenantWaiting(g *pool.Gate, id string, n int) func() bool {
	return func() bool {
		s, _ := g.TenantStat(id)
		return s.Waiting == n
	}
}
