package tracing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
)

// TestBudgetAndTimeLimitsVisible: refusals are counted by cause (a
// budget's, a cap's, a caller's deadline), the connection-time a budget
// charged and what is left of it are metrics of the tenant, the admission
// spans of a budgeted tenant carry the budget's event (and no other
// tenant's do), and work ended for a time limit is counted by limit.
func TestBudgetAndTimeLimitsVisible(t *testing.T) {
	e := newEnv(t, tracing.WithCardinality(tracing.ByTenant(10)))
	g := newGate(t, e.tr, pool.Config{
		Capacity: 4,
		Plans: map[string]pool.Plan{
			// A burst of 1 s pays for one call of the 1 s expected before
			// any hold is measured: the second is refused by the budget.
			"metered": {MaxConns: 2, Budget: pool.Budget{Rate: 0.001, Burst: time.Second}},
			"capped":  {MaxConns: 1, MaxWaiting: 1},
		},
		DefaultPlan: "capped",
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			if id == "m" {
				return pool.Tenant{Plan: "metered"}, nil
			}
			return pool.Tenant{}, nil
		},
	})
	stop, err := e.tr.ObserveGate(g)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stop() }()
	ctx, root := e.root(context.Background())
	defer root.End()

	m1 := mustAcquire(t, ctx, g, "m")
	if _, err := g.Acquire(ctx, "m"); !errors.Is(err, pool.ErrOverBudget) {
		t.Fatalf("m's second call: %v, want ErrOverBudget", err)
	}
	c1 := mustAcquire(t, ctx, g, "c")
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	if _, err := g.Acquire(short, "c"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("c's call with a short deadline: %v, want DeadlineExceeded", err)
	}
	cancel()
	waitCtx, cancelWait := context.WithCancel(ctx)
	waiter := acquireAsync(waitCtx, g, "c")
	tenantdbtest.Eventually(t, probeTimeout, "c waits", tenantWaiting(g, "c", 1))
	if _, err := g.Acquire(ctx, "c"); !errors.Is(err, pool.ErrOverLimit) || errors.Is(err, pool.ErrOverBudget) {
		t.Fatalf("c's call with its queue full: %v, want ErrOverLimit for its cap", err)
	}
	cancelWait()
	_ = recv(t, waiter)
	c1.Exceeded(pool.LimitIdleInTransaction)
	c1.Release()
	time.Sleep(5 * time.Millisecond) // a hold measurably above 0 for the budget's charge
	m1.Release()

	rm := e.collect(t)
	m, c := tracing.TenantKey.String("m"), tracing.TenantKey.String("c")
	outcome := func(o pool.Outcome) attribute.KeyValue { return tracing.OutcomeKey.String(o.String()) }
	for _, r := range []struct {
		want []attribute.KeyValue
	}{
		{[]attribute.KeyValue{m, outcome(pool.Rejected), tracing.CauseKey.String(tracing.CauseBudget)}},
		{[]attribute.KeyValue{c, outcome(pool.Rejected), tracing.CauseKey.String(tracing.CauseCap)}},
		{[]attribute.KeyValue{c, outcome(pool.TimedOut), tracing.CauseKey.String(tracing.CauseDeadline)}},
	} {
		if got := value(t, rm, "tenantdb.tenant.connection.rejections", r.want...).value; got != 1 {
			t.Errorf("rejections%v = %v, want 1", r.want, got)
		}
	}
	if n := len(points(t, rm, "tenantdb.tenant.connection.rejections")); n != 3 {
		t.Errorf("%d rejection series, want 3: %v", n, points(t, rm, "tenantdb.tenant.connection.rejections"))
	}
	st, _ := g.TenantStat("m")
	if got := value(t, rm, "tenantdb.tenant.budget.used", m).value; got <= 0 || got != st.BudgetUsed.Seconds() {
		t.Errorf("budget.used{m} = %v s, want TenantStat's BudgetUsed %v", got, st.BudgetUsed)
	}
	if pts := points(t, rm, "tenantdb.tenant.budget.used"); len(pts) != 1 {
		t.Errorf("budget.used has %d series, want m's only: %v", len(pts), pts)
	}
	left := value(t, rm, "tenantdb.tenant.budget.left", m).value
	if d := left - st.BudgetLeft.Seconds(); d < -0.01 || d > 0.01 || left >= 1 {
		t.Errorf("budget.left{m} = %v s, TenantStat says %v (burst 1 s)", left, st.BudgetLeft)
	}
	if pts := points(t, rm, "tenantdb.tenant.budget.left"); len(pts) != 1 {
		t.Errorf("budget.left has %d series, want m's only (c has no budget): %v", len(pts), pts)
	}
	if got := value(t, rm, "tenantdb.tenant.timeouts", c, tracing.TimeLimitKey.String("idle_in_transaction")).value; got != 1 {
		t.Errorf("timeouts{c, idle_in_transaction} = %v, want 1", got)
	}
	if cs, _ := g.TenantStat("c"); cs.IdleTimeouts != 1 {
		t.Errorf("TenantStat(c).IdleTimeouts = %d, want 1", cs.IdleTimeouts)
	}

	// Spans: m's two admissions carry the budget's event; c's none.
	var events []sdktrace.Event
	for _, s := range e.ended(tracing.AcquireSpanName) {
		tenant := mustAttr(t, s, tracing.TenantKey).AsString()
		for _, ev := range s.Events() {
			if ev.Name != tracing.BudgetEventName {
				continue
			}
			if tenant != "m" {
				t.Errorf("tenant %s's admission span has a budget event", tenant)
			}
			events = append(events, ev)
		}
	}
	if len(events) != 2 {
		t.Fatalf("%d budget events, want 2 (m's grant and refusal)", len(events))
	}
	evAttr := func(ev sdktrace.Event, k attribute.Key) (attribute.Value, bool) {
		for _, kv := range ev.Attributes {
			if kv.Key == k {
				return kv.Value, true
			}
		}
		return attribute.Value{}, false
	}
	granted, refused := events[0], events[1]
	if o, _ := evAttr(granted, tracing.OutcomeKey); o.AsString() != "acquired" {
		t.Errorf("first budget event's outcome %v, want acquired", o)
	}
	if l, ok := evAttr(granted, tracing.BudgetLeftKey); !ok || l.AsFloat64() > 0.01 {
		t.Errorf("budget left after the grant: %v, want about 0 (1 s burst less 1 s expected)", l)
	}
	if cause, _ := evAttr(refused, tracing.CauseKey); cause.AsString() != tracing.CauseBudget {
		t.Errorf("the refusal's budget event: cause %v, want budget", cause)
	}
}
