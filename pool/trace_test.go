package pool_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

type ctxKey struct{}

// recordingTracer records what it is told. It calls back into the Gate from
// every hook, which would deadlock if a hook were called under the lock.
type recordingTracer struct {
	mu       sync.Mutex
	ends     []pool.TraceAcquireEndData
	releases []pool.TraceReleaseData
	lostCtx  int
}

func (r *recordingTracer) TraceAcquireStart(ctx context.Context, g *pool.Gate, d pool.TraceAcquireStartData) context.Context {
	g.Stat()
	return context.WithValue(ctx, ctxKey{}, d.Tenant)
}

func (r *recordingTracer) TraceAcquireEnd(ctx context.Context, g *pool.Gate, d pool.TraceAcquireEndData) {
	g.Stat()
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Value(ctxKey{}) != d.Tenant {
		r.lostCtx++
	}
	r.ends = append(r.ends, d)
}

func (r *recordingTracer) TraceRelease(ctx context.Context, g *pool.Gate, d pool.TraceReleaseData) {
	g.Stat()
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Value(ctxKey{}) != d.Tenant {
		r.lostCtx++
	}
	r.releases = append(r.releases, d)
}

func (r *recordingTracer) last() pool.TraceAcquireEndData {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ends[len(r.ends)-1]
}

func TestTracerSeesEveryOutcome(t *testing.T) {
	rec := &recordingTracer{}
	g := mustNew(t, pool.Config{
		Capacity: 2, Tracer: rec,
		Plans: map[string]pool.Plan{"std": {MaxConns: 1, MaxWaiting: 1, MaxWait: 20 * time.Millisecond}},
	})

	// Acquired at once.
	a := mustAcquire(t, g, "a")
	if d := rec.last(); d.Outcome != pool.Acquired || d.Plan != "std" || d.Limit != 1 || d.InUse != 0 || d.Position != 0 || d.Err != nil {
		t.Fatalf("acquired: %+v", d)
	}
	// Timed out after MaxWait over the cap.
	if _, err := g.Acquire(context.Background(), "a"); !errors.Is(err, pool.ErrOverLimit) {
		t.Fatal(err)
	}
	if d := rec.last(); d.Outcome != pool.TimedOut || d.InUse != 1 || d.Position != 1 || d.TenantWait < 20*time.Millisecond || !errors.Is(d.Err, pool.ErrOverLimit) {
		t.Fatalf("timed out: %+v", d)
	}
	// Rejected with a full queue.
	waiter := acquireAsync(context.Background(), g, "a")
	eventually(t, "a waits", tenantWaitingIs(g, "a", 1))
	if _, err := g.Acquire(context.Background(), "a"); !errors.Is(err, pool.ErrOverLimit) {
		t.Fatal(err)
	}
	if d := rec.last(); d.Outcome != pool.Rejected || d.Err == nil {
		t.Fatalf("rejected: %+v", d)
	}
	time.Sleep(time.Millisecond) // let a's permit age, so that its hold is visible
	a.Release()
	r := recv(t, waiter)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if d := rec.last(); d.Outcome != pool.Acquired || d.TenantWait <= 0 || d.Position != 1 {
		t.Fatalf("waited for its cap: %+v", d)
	}
	// Waiting for global capacity, then cancelled.
	b := mustAcquire(t, g, "b")
	ctx, cancel := context.WithCancel(context.Background())
	c := acquireAsync(ctx, g, "c")
	eventually(t, "c waits", tenantWaitingIs(g, "c", 1))
	cancel()
	if r := recv(t, c); !errors.Is(r.err, context.Canceled) {
		t.Fatal(r.err)
	}
	if d := rec.last(); d.Outcome != pool.Cancelled || d.TenantWait != 0 || d.GlobalWait <= 0 {
		t.Fatalf("cancelled: %+v", d)
	}
	// Invalid tenant: failed, before anything is known.
	if _, err := g.Acquire(context.Background(), ""); !errors.Is(err, pool.ErrInvalidTenant) {
		t.Fatal(err)
	}
	if d := rec.last(); d.Outcome != pool.Failed || d.Plan != "" {
		t.Fatalf("invalid: %+v", d)
	}
	r.p.Release()
	b.Release()

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.releases) != 3 {
		t.Fatalf("%d releases traced, want 3", len(rec.releases))
	}
	if rel := rec.releases[0]; rel.Tenant != "a" || rel.Plan != "std" || rel.Hold < time.Millisecond {
		t.Fatalf("release: %+v", rel)
	}
	if rec.lostCtx != 0 {
		t.Fatalf("%d hooks did not get the context TraceAcquireStart returned", rec.lostCtx)
	}
}
