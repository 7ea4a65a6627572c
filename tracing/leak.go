package tracing

import (
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenantdb/tenantdb/pool"
)

// Names of the events leak detection adds to the span that acquired a permit.
const (
	LeakEventName     = "tenantdb.connection.leak"
	LeakReturnedEvent = "tenantdb.connection.leak.returned"
)

// leakWatch watches one granted permit under leak detection. Its timer fires
// once the threshold has passed; the permit's release stops it. Exactly one
// of the two wins the state, so a permit is reported at most once, and its
// return is logged only after the report is complete.
type leakWatch struct {
	t              *Tracer
	ctx            context.Context // the acquiring caller's: its span gets the events
	tenant, plan   string
	acquired       time.Time
	pcs            []uintptr // the acquiring stack, formatted only if reported
	timer          *time.Timer
	state          atomic.Uint32
	reportFinished chan struct{} // closed when the report has been made
}

const (
	watchHeld uint32 = iota
	watchReporting
	watchReleased
)

// maxLeakStack bounds the frames captured per acquire.
const maxLeakStack = 32

// watch starts watching a permit just granted. It runs on the acquiring
// goroutine, inside Gate.Acquire, which is what makes the captured stack the
// caller's.
func (t *Tracer) watch(ctx context.Context, d pool.TraceAcquireEndData) *leakWatch {
	w := &leakWatch{
		t: t, ctx: ctx, tenant: d.Tenant, plan: d.Plan,
		acquired:       time.Now(),
		pcs:            make([]uintptr, maxLeakStack),
		reportFinished: make(chan struct{}),
	}
	// Skip runtime.Callers and watch; pool and tracing frames are dropped
	// when the stack is formatted.
	w.pcs = w.pcs[:runtime.Callers(2, w.pcs)]
	w.timer = time.AfterFunc(t.cfg.leakThreshold, w.report)
	return w
}

func (t *Tracer) logger() *slog.Logger {
	if t.cfg.logger != nil {
		return t.cfg.logger
	}
	return slog.Default()
}

// report runs on the timer's goroutine when the permit is still held past
// the threshold.
func (w *leakWatch) report() {
	if !w.state.CompareAndSwap(watchHeld, watchReporting) {
		return // released meanwhile
	}
	defer close(w.reportFinished)
	held := time.Since(w.acquired)
	threshold := w.t.cfg.leakThreshold
	stack := formatStack(w.pcs)
	w.t.logger().LogAttrs(w.ctx, slog.LevelWarn, "tenantdb: connection held past the leak detection threshold",
		slog.String("tenant", w.tenant),
		slog.String("plan", w.plan),
		slog.Duration("held", held),
		slog.Duration("threshold", threshold),
		slog.String("stack", stack))
	trace.SpanFromContext(w.ctx).AddEvent(LeakEventName, trace.WithAttributes(
		TenantKey.String(w.tenant),
		HoldKey.Float64(held.Seconds()),
		LeakThresholdKey.Float64(threshold.Seconds()),
		semconv.CodeStacktrace(stack),
	))
	w.t.tenantLeaks.Add(w.ctx, 1, w.t.labels.forTenant(w.tenant, w.plan, true).add...)
}

// release runs when the permit is released. If the permit was reported, it
// waits for the report to be complete, so that the two log lines come in
// order, and logs the return.
func (w *leakWatch) release(d pool.TraceReleaseData) {
	w.timer.Stop()
	if w.state.CompareAndSwap(watchHeld, watchReleased) {
		return
	}
	<-w.reportFinished
	w.t.logger().LogAttrs(w.ctx, slog.LevelInfo, "tenantdb: previously reported leaked connection returned",
		slog.String("tenant", w.tenant),
		slog.String("plan", w.plan),
		slog.Duration("held", d.Hold))
	trace.SpanFromContext(w.ctx).AddEvent(LeakReturnedEvent, trace.WithAttributes(
		TenantKey.String(w.tenant),
		HoldKey.Float64(d.Hold.Seconds()),
	))
}

// formatStack formats pcs as runtime/debug.Stack does, leaving out the
// frames of this package and of pool, which are the same in every report.
func formatStack(pcs []uintptr) string {
	var b strings.Builder
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "github.com/tenantdb/tenantdb/tracing.") &&
			!strings.HasPrefix(f.Function, "github.com/tenantdb/tenantdb/pool.") && f.Function != "" {
			b.WriteString(f.Function)
			b.WriteString("\n\t")
			b.WriteString(f.File)
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(f.Line))
			b.WriteByte('\n')
		}
		if !more {
			break
		}
	}
	return b.String()
}
