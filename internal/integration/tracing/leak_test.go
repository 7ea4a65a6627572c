package tracing_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tracing"
)

// logRecorder is a slog.Handler that keeps records and signals each one.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
	signal  chan struct{}
}

func newLogRecorder() *logRecorder { return &logRecorder{signal: make(chan struct{}, 1000)} }

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Clone())
	h.mu.Unlock()
	h.signal <- struct{}{}
	return nil
}

func (h *logRecorder) all() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slog.Record(nil), h.records...)
}

func (h *logRecorder) await(t testing.TB, what string) {
	t.Helper()
	select {
	case <-h.signal:
	case <-time.After(20 * time.Second):
		t.Fatalf("no log record for %s", what)
	}
}

func recordAttrs(r slog.Record) map[string]slog.Value {
	m := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value
		return true
	})
	return m
}

// acquireAndForget stands for application code that leaks a permit: its name
// must appear in the reported stack.
func acquireAndForget(t *testing.T, ctx context.Context, g *pool.Gate) pool.Permit {
	return mustAcquire(t, ctx, g, "leaky")
}

// TestLeakDetectionReportsAndReturns holds a permit past the threshold and
// checks the report (log, span event, count), then its return.
func TestLeakDetectionReportsAndReturns(t *testing.T) {
	logs := newLogRecorder()
	const threshold = time.Millisecond
	e := newEnv(t, tracing.WithLeakDetection(threshold), tracing.WithLogger(slog.New(logs)),
		tracing.WithCardinality(tracing.ByTenant(10)))
	g := newGate(t, e.tr, pool.Config{Capacity: 2})
	ctx, root := e.root(context.Background())
	p := acquireAndForget(t, ctx, g)

	logs.await(t, "the leak")
	rec := logs.all()[0]
	attrs := recordAttrs(rec)
	if rec.Level != slog.LevelWarn || attrs["tenant"].String() != "leaky" || attrs["held"].Duration() < threshold {
		t.Fatalf("leak record: %v %q %v", rec.Level, rec.Message, attrs)
	}
	stack := attrs["stack"].String()
	if !strings.Contains(stack, "tracing_test.acquireAndForget") {
		t.Errorf("the stack does not show who acquired:\n%s", stack)
	}
	if strings.Contains(stack, "tenantdb/pool.") || strings.Contains(stack, "tenantdb/tracing.") {
		t.Errorf("the stack shows the machinery's own frames:\n%s", stack)
	}

	p.Release()
	logs.await(t, "the return")
	// The leak is counted after its log record, on the timer's goroutine:
	// reading the count right after the record raced with it (about one run
	// in 15 under load). The return is logged only once the report is
	// complete, so the count is read after the return.
	rm := e.collect(t)
	if got := value(t, rm, "tenantdb.tenant.connection.leaks", tracing.TenantKey.String("leaky")).value; got != 1 {
		t.Errorf("leaks = %v, want 1", got)
	}
	recs := logs.all()
	if len(recs) != 2 || recs[1].Level != slog.LevelInfo || recordAttrs(recs[1])["held"].Duration() < threshold {
		t.Fatalf("after release: %d records; last %v", len(recs), recs[len(recs)-1])
	}
	p.Release() // idempotent: no third record
	root.End()
	if n := len(logs.all()); n != 2 {
		t.Errorf("%d records after a second Release", n)
	}

	// The events are on the span that acquired.
	req := e.ended("request")[0]
	var names []string
	for _, ev := range req.Events() {
		names = append(names, ev.Name)
		if ev.Name == tracing.LeakEventName {
			set := attribute.NewSet(ev.Attributes...)
			if v, _ := set.Value(tracing.TenantKey); v.AsString() != "leaky" {
				t.Errorf("leak event tenant %v", v.Emit())
			}
			if v, _ := set.Value(semconv.CodeStacktraceKey); !strings.Contains(v.AsString(), "acquireAndForget") {
				t.Errorf("leak event stack %q", v.AsString())
			}
			if v, _ := set.Value(tracing.LeakThresholdKey); v.AsFloat64() != threshold.Seconds() {
				t.Errorf("leak event threshold %v", v.AsFloat64())
			}
		}
	}
	if strings.Join(names, ",") != tracing.LeakEventName+","+tracing.LeakReturnedEvent {
		t.Errorf("events on the request span: %v", names)
	}
}

// TestLeakDetectionQuietWhenReleasedInTime checks that permits released
// before the threshold are never reported, and that their timers are
// stopped (goleak in TestMain would see a pending report fire otherwise).
func TestLeakDetectionQuietWhenReleasedInTime(t *testing.T) {
	logs := newLogRecorder()
	e := newEnv(t, tracing.WithLeakDetection(time.Hour), tracing.WithLogger(slog.New(logs)))
	g := newGate(t, e.tr, pool.Config{Capacity: 2})
	for range 100 {
		mustAcquire(t, context.Background(), g, "a").Release()
	}
	if n := len(logs.all()); n != 0 {
		t.Fatalf("%d log records for permits released in time", n)
	}
	if _, ok := metricNamed(e.collect(t), "tenantdb.tenant.connection.leaks"); ok {
		t.Fatal("leaks counted for permits released in time")
	}
}

// TestLeakReportRacingRelease releases permits just as their report fires:
// each permit is reported at most once, and its return is logged if and
// only if it was reported, after the report.
func TestLeakReportRacingRelease(t *testing.T) {
	logs := newLogRecorder()
	e := newEnv(t, tracing.WithLeakDetection(time.Microsecond), tracing.WithLogger(slog.New(logs)))
	g := newGate(t, e.tr, pool.Config{Capacity: 64, Plans: map[string]pool.Plan{"p": {MaxConns: 1}}})
	const n = 300
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			p := mustAcquire(t, context.Background(), g, fmt.Sprintf("t%03d", i))
			p.Release()
		})
	}
	wg.Wait()
	// A release that loses the race waits for the report to finish, so by
	// now every report has its return.
	warn, info := 0, 0
	for _, r := range logs.all() {
		if r.Level == slog.LevelWarn {
			warn++
		} else {
			info++
		}
	}
	if warn != info {
		t.Fatalf("%d reports, %d returns", warn, info)
	}
	t.Logf("%d of %d permits reported", warn, n)
	seen := map[string]slog.Level{}
	for _, r := range logs.all() {
		tenant := recordAttrs(r)["tenant"].String()
		prev, ok := seen[tenant]
		switch {
		case r.Level == slog.LevelWarn && ok:
			t.Fatalf("%s reported twice", tenant)
		case r.Level == slog.LevelInfo && (!ok || prev != slog.LevelWarn):
			t.Fatalf("%s returned without a report before it", tenant)
		}
		seen[tenant] = r.Level
	}
}
