package pool_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

var batch = pool.WithClass(context.Background(), "batch")

func acquireClassAsync(ctx context.Context, g *pool.Gate, id string) <-chan result {
	return acquireAsync(ctx, g, id)
}

func TestClassCapInsideTenantCap(t *testing.T) {
	// acme's cap is 4 and its batch class may hold 2 of them: a batch
	// backlog queues at 2 while interactive work (the default class) still
	// gets the other 2 at once, and is rejected past the cap as its plan says.
	g := mustNew(t, pool.Config{Capacity: 10,
		Plans:   map[string]pool.Plan{"p": {MaxConns: 4}},
		Classes: map[string]pool.Class{"batch": {MaxConns: 2, MaxWaiting: 10, MaxShare: 1}}})
	b1, err := g.Acquire(batch, "acme")
	if err != nil {
		t.Fatal(err)
	}
	b2, err := g.Acquire(batch, "acme")
	if err != nil {
		t.Fatal(err)
	}
	queued := acquireClassAsync(batch, g, "acme")
	eventually(t, "the third batch request queues", tenantWaitingIs(g, "acme", 1))
	i1, i2 := mustAcquire(t, g, "acme"), mustAcquire(t, g, "acme") // not behind the batch queue
	_, err = g.Acquire(context.Background(), "acme")
	var ole *pool.OverLimitError
	if !errors.As(err, &ole) || ole.Class != "" || ole.Limit != 4 || ole.Waited != 0 {
		t.Fatalf("interactive past the cap: err = %v, want an at-once rejection at the cap of 4", err)
	}
	i1.Release()
	// A tenant slot is free but the batch class is at its cap: the queued
	// batch request stays queued, and the slot goes to interactive work.
	assertPending(t, queued, g, "acme", 1)
	i1 = mustAcquire(t, g, "acme")
	b1.Release()
	if r := recv(t, queued); r.err != nil {
		t.Fatal(r.err)
	} else {
		r.p.Release()
	}
	for _, p := range []pool.Permit{b2, i1, i2} {
		p.Release()
	}
	s, _ := g.TenantStat("acme")
	if len(s.Classes) != 2 || s.Classes[1].Class != "batch" || s.Classes[1].Acquired != 3 || s.Classes[1].Limit != 2 ||
		s.Classes[0].Class != pool.DefaultClass || s.Classes[0].Acquired != 3 || s.Classes[0].Rejected != 1 {
		t.Fatalf("per-class stats: %+v", s.Classes)
	}
	assertDrained(t, g)
}

func TestClassQueuePolicyIsItsOwn(t *testing.T) {
	// The plan rejects over the cap; the batch class queues up to 2 for at
	// most MaxWait, then rejects with an error that names the class and its cap.
	g := mustNew(t, pool.Config{Capacity: 10,
		Plans:   map[string]pool.Plan{"p": {MaxConns: 4}},
		Classes: map[string]pool.Class{"batch": {MaxConns: 1, MaxWaiting: 2, MaxWait: 50 * time.Millisecond}}})
	held := mustAcquireCtx(t, g, batch, "acme")
	w1, w2 := acquireClassAsync(batch, g, "acme"), acquireClassAsync(batch, g, "acme")
	eventually(t, "two batch requests queue", tenantWaitingIs(g, "acme", 2))
	_, err := g.Acquire(batch, "acme")
	var ole *pool.OverLimitError
	if !errors.As(err, &ole) || ole.Class != "batch" || ole.Limit != 1 || ole.Waited != 0 ||
		!strings.Contains(err.Error(), `class "batch"`) {
		t.Fatalf("third batch request: err = %v, want an at-once rejection naming class batch and its cap 1", err)
	}
	for _, ch := range []<-chan result{w1, w2} {
		if r := recv(t, ch); !errors.As(r.err, &ole) || ole.Waited == 0 || ole.Class != "batch" {
			t.Fatalf("queued batch request: err = %v, want a timeout after MaxWait", r.err)
		}
	}
	held.Release()
	assertDrained(t, g)
}

func mustAcquireCtx(t testing.TB, g *pool.Gate, ctx context.Context, id string) pool.Permit {
	t.Helper()
	p, err := g.Acquire(ctx, id)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", id, err)
	}
	return p
}

func TestClassMaxShareKeepsCapacityFreeForDefaultClass(t *testing.T) {
	// Capacity 4, batch at most half of it across tenants: two tenants'
	// batch work holds 2 and queues with 2 units free, which a third
	// tenant's interactive work takes at once.
	g := mustNew(t, pool.Config{Capacity: 4,
		Plans:   map[string]pool.Plan{"p": {MaxConns: 4}},
		Classes: map[string]pool.Class{"batch": {MaxConns: 2, MaxWaiting: pool.Unbounded, MaxShare: 0.5}}})
	a1, b1 := mustAcquireCtx(t, g, batch, "a"), mustAcquireCtx(t, g, batch, "b")
	a2 := acquireClassAsync(batch, g, "a")
	b2 := acquireClassAsync(batch, g, "b")
	eventually(t, "batch waits at its share", waitingIs(g, 2))
	if s := g.Stat(); s.InUse != 2 || s.Classes[1].InUse != 2 || s.Classes[1].Limit != 2 || s.Classes[1].Waiting != 2 {
		t.Fatalf("at the share: %+v", s)
	}
	q1, q2 := mustAcquire(t, g, "quiet"), mustAcquire(t, g, "quiet")
	a1.Release() // one batch unit frees: the next batch request takes it
	first := <-pickFirst(a2, b2)
	b1.Release()
	second := <-pickFirst(a2, b2)
	for _, r := range []result{first, second} {
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.p.Release()
	}
	q1.Release()
	q2.Release()
	assertDrained(t, g)
}

// pickFirst returns a channel that delivers the first result of a or b.
func pickFirst(a, b <-chan result) <-chan result {
	ch := make(chan result, 1)
	go func() {
		select {
		case r := <-a:
			ch <- r
		case r := <-b:
			ch <- r
		}
	}()
	return ch
}

func TestDefaultClassServedBeforeBatchButBatchKeepsItsMinShare(t *testing.T) {
	// A saturated gate of 4, with batch (no share bound) and interactive
	// work of other tenants waiting: a released unit goes to interactive
	// work while batch holds its MinShare (1 of 4) or more, and to batch
	// once it holds less, so that batch never starves.
	g := mustNew(t, pool.Config{Capacity: 4,
		Plans:   map[string]pool.Plan{"p": {MaxConns: 4, MaxWaiting: pool.Unbounded}},
		Classes: map[string]pool.Class{"batch": {MaxConns: 4, MaxWaiting: pool.Unbounded, MaxShare: 1, MinShare: 0.25}}})
	b1, b2 := mustAcquireCtx(t, g, batch, "b"), mustAcquireCtx(t, g, batch, "b")
	i1, i2 := mustAcquire(t, g, "i"), mustAcquire(t, g, "i")
	bw := acquireClassAsync(batch, g, "b2") // waits for capacity first
	eventually(t, "batch waits", waitingIs(g, 1))
	iw := acquireClassAsync(context.Background(), g, "i2")
	eventually(t, "interactive waits behind it", waitingIs(g, 2))

	b1.Release() // batch holds 1, its MinShare: interactive goes first
	i3 := recv(t, iw)
	if i3.err != nil {
		t.Fatal(i3.err)
	}
	assertPending(t, bw, g, "b2", 1)
	iw = acquireClassAsync(context.Background(), g, "i2")
	eventually(t, "interactive waits again", waitingIs(g, 2))
	b2.Release() // batch holds 0, below its MinShare: batch goes first
	r := recv(t, bw)
	if r.err != nil {
		t.Fatal(r.err)
	}
	assertPending(t, iw, g, "i2", 1)
	r.p.Release() // batch back to 0, interactive waiting: it goes
	if r := recv(t, iw); r.err != nil {
		t.Fatal(r.err)
	} else {
		r.p.Release()
	}
	i1.Release()
	i2.Release()
	i3.p.Release()
	assertDrained(t, g)
}

func TestWeightedRoundRobinWithinAClass(t *testing.T) {
	// Inside the batch class, tenants of weight 1 and 3 that both wait for
	// capacity are served 1:3 (within 10%), as the default class is.
	g := mustNew(t, pool.Config{Capacity: 2,
		Plans: map[string]pool.Plan{
			"w1": {MaxConns: 2, MaxWaiting: pool.Unbounded, Weight: 1},
			"w3": {MaxConns: 2, MaxWaiting: pool.Unbounded, Weight: 3},
		},
		DefaultPlan: "w1",
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			if id == "heavy" {
				return pool.Tenant{Plan: "w3"}, nil
			}
			return pool.Tenant{}, nil
		},
		Classes: map[string]pool.Class{"batch": {MaxConns: 2, MaxWaiting: pool.Unbounded, MaxShare: 1}}})
	var got [2]atomic.Int64
	ctx, stop := context.WithCancel(batch)
	defer stop()
	done := make(chan struct{})
	for i, id := range []string{"light", "heavy"} {
		for range 4 {
			go func() {
				defer func() { done <- struct{}{} }()
				for ctx.Err() == nil {
					p, err := g.Acquire(ctx, id)
					if err != nil {
						return
					}
					got[i].Add(1)
					time.Sleep(50 * time.Microsecond)
					p.Release()
				}
			}()
		}
	}
	eventually(t, "4000 grants", func() bool { return got[0].Load()+got[1].Load() >= 4000 })
	stop()
	for range 8 {
		<-done
	}
	ratio := float64(got[1].Load()) / float64(got[0].Load())
	if ratio < 2.7 || ratio > 3.3 {
		t.Fatalf("heavy:light = %.2f (%d:%d), want 3 within 10%%", ratio, got[1].Load(), got[0].Load())
	}
}

func TestUnknownOrMalformedClassIsRefused(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 4, Classes: map[string]pool.Class{"batch": {MaxConns: 1}}})
	for _, name := range []string{"nope", "", "bad name", strings.Repeat("x", 33)} {
		_, err := g.Acquire(pool.WithClass(context.Background(), name), "acme")
		if !errors.Is(err, pool.ErrUnknownClass) || !strings.Contains(err.Error(), "acme") {
			t.Errorf("class %q: err = %v, want ErrUnknownClass naming the tenant", name, err)
		}
	}
	_, err := g.Acquire(pool.WithClass(context.Background(), "nope"), "acme")
	if !strings.Contains(errString(err), "default, batch") {
		t.Errorf("err = %v, want it to list the classes", err)
	}
	mustAcquireCtx(t, g, pool.WithClass(context.Background(), pool.DefaultClass), "acme").Release()
	assertDrained(t, g)
	if s := g.Stat(); s.Acquired != 1 || s.Rejected != 0 {
		t.Fatalf("refused classes were counted as admissions: %+v", s)
	}
	// Without Classes, any class is unknown too.
	plain := mustNew(t, pool.Config{Capacity: 4})
	if _, err := plain.Acquire(batch, "acme"); !errors.Is(err, pool.ErrUnknownClass) {
		t.Errorf("no classes configured: err = %v, want ErrUnknownClass", err)
	}
}

func TestClassConfigErrors(t *testing.T) {
	plans := map[string]pool.Plan{"free": {MaxConns: 2}, "std": {MaxConns: 10}}
	for _, tc := range []struct {
		name    string
		classes map[string]pool.Class
		plans   map[string]pool.Plan
		want    string
	}{
		{"cap above a plan's", map[string]pool.Class{"batch": {MaxConns: 6}}, plans, `class "batch": MaxConns 6 is above plan "free"'s MaxConns 2`},
		{"malformed name", map[string]pool.Class{"bulk load": {MaxConns: 1}}, nil, `class name "bulk load"`},
		{"empty name", map[string]pool.Class{"": {MaxConns: 1}}, nil, "empty class name"},
		{"default name", map[string]pool.Class{"default": {MaxConns: 1}}, nil, "taken"},
		{"no cap", map[string]pool.Class{"batch": {}}, nil, "MaxConns must be positive"},
		{"share above 1", map[string]pool.Class{"batch": {MaxConns: 1, MaxShare: 1.5}}, nil, "MaxShare"},
		{"min above max share", map[string]pool.Class{"batch": {MaxConns: 1, MaxShare: 0.5, MinShare: 0.6}}, nil, "MinShare"},
		{"negative wait", map[string]pool.Class{"batch": {MaxConns: 1, MaxWait: -1}}, nil, "MaxWait"},
		{"plan names an unknown class", map[string]pool.Class{"batch": {MaxConns: 1}},
			map[string]pool.Plan{"p": {MaxConns: 2, ClassConns: map[string]int{"bacth": 1}}}, `ClassConns names "bacth"`},
		{"plan's class cap above its cap", map[string]pool.Class{"batch": {MaxConns: 1}},
			map[string]pool.Plan{"p": {MaxConns: 2, ClassConns: map[string]int{"batch": 3}}}, `ClassConns["batch"] 3`},
		{"too many", func() map[string]pool.Class {
			m := map[string]pool.Class{}
			for _, n := range strings.Split("a b c d e f g h i", " ") {
				m[n] = pool.Class{MaxConns: 1}
			}
			return m
		}(), nil, "at most 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pool.New(pool.Config{Capacity: 10, Plans: tc.plans, DefaultPlan: firstPlan(tc.plans), Classes: tc.classes})
			if !errors.Is(err, pool.ErrInvalidConfig) || !strings.Contains(errString(err), tc.want) {
				t.Fatalf("err = %v, want ErrInvalidConfig saying %q", err, tc.want)
			}
		})
	}
	// A plan's own class cap makes a small plan fit; SetPlan checks the same.
	g := mustNew(t, pool.Config{Capacity: 10, DefaultPlan: "std",
		Plans:   map[string]pool.Plan{"free": {MaxConns: 2, ClassConns: map[string]int{"batch": 1}}, "std": {MaxConns: 10}},
		Classes: map[string]pool.Class{"batch": {MaxConns: 6}}})
	if err := g.SetPlan("tiny", pool.Plan{MaxConns: 1}); !errors.Is(err, pool.ErrInvalidConfig) {
		t.Fatalf("SetPlan with a class cap above its cap: err = %v", err)
	}
	if err := g.SetPlan("tiny", pool.Plan{MaxConns: 1, ClassConns: map[string]int{"batch": 1}}); err != nil {
		t.Fatal(err)
	}
}

func firstPlan(m map[string]pool.Plan) string {
	if _, ok := m["free"]; ok {
		return "free"
	}
	return ""
}

func TestLoweredCapBoundsTheClassToo(t *testing.T) {
	// SetTenantLimit lowers acme's cap below its batch class's cap: batch
	// holds at most the new cap, and its waiting requests wait for it.
	g := mustNew(t, pool.Config{Capacity: 10,
		Plans:   map[string]pool.Plan{"p": {MaxConns: 6}},
		Classes: map[string]pool.Class{"batch": {MaxConns: 4, MaxWaiting: pool.Unbounded, MaxShare: 1}}})
	if err := g.SetTenantLimit("acme", 2); err != nil {
		t.Fatal(err)
	}
	p1, p2 := mustAcquireCtx(t, g, batch, "acme"), mustAcquireCtx(t, g, batch, "acme")
	w := acquireClassAsync(batch, g, "acme")
	eventually(t, "a third batch request waits", tenantWaitingIs(g, "acme", 1))
	if s, _ := g.TenantStat("acme"); s.Classes[1].Limit != 2 {
		t.Fatalf("batch limit under a cap of 2: %+v", s.Classes[1])
	}
	p1.Release()
	if r := recv(t, w); r.err != nil {
		t.Fatal(r.err)
	} else {
		r.p.Release()
	}
	p2.Release()
	assertDrained(t, g)
}

func TestRunnerJobsKeepTheirClass(t *testing.T) {
	// A tenant's batch jobs run at most its batch cap (1) at once and
	// queue apart: a default-class job submitted behind a batch backlog
	// runs while the backlog waits.
	g := mustNew(t, pool.Config{Capacity: 4,
		Plans:   map[string]pool.Plan{"p": {MaxConns: 3}},
		Classes: map[string]pool.Class{"batch": {MaxConns: 1}}})
	r, err := pool.NewRunner(pool.RunnerConfig{Gate: g})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var running, most atomic.Int64
	for range 5 {
		err := r.Submit(batch, "acme", func(ctx context.Context) {
			if c, _ := pool.ClassFrom(ctx); c != "batch" {
				t.Errorf("job's class %q, want batch", c)
			}
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release
			running.Add(-1)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	ran := make(chan struct{})
	if err := r.Submit(context.Background(), "acme", func(context.Context) { close(ran) }); err != nil {
		t.Fatal(err)
	}
	recvErr(t, ran)
	if err := r.Submit(pool.WithClass(context.Background(), "nope"), "acme", func(context.Context) {}); !errors.Is(err, pool.ErrUnknownClass) {
		t.Fatalf("Submit with an unknown class: err = %v", err)
	}
	close(release)
	if _, err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if most.Load() != 1 {
		t.Fatalf("%d batch jobs ran at once, want at most the batch cap of 1", most.Load())
	}
	assertDrained(t, g)
}

func recvErr(t testing.TB, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing within 10s")
	}
}
