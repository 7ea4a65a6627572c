package pool

import (
	"context"
	"errors"
	"testing"
	"time"
)

// classBudgetGate is a Gate whose plan has no budget and whose two classes
// each give every tenant 1 connection-second per second with a burst of
// 2 s: "interactive" rejects out of budget, "batch" queues.
func classBudgetGate(t *testing.T, planBudget Budget) (*Gate, *fakeClock) {
	classBudget := Budget{Rate: 1, Burst: 2 * time.Second}
	return newTestGate(t, Config{Capacity: 20,
		Plans: map[string]Plan{"p": {MaxConns: 8, Budget: planBudget}},
		Classes: map[string]Class{
			"interactive": {MaxConns: 4, Budget: classBudget},
			"batch":       {MaxConns: 4, MaxWaiting: 2, Budget: classBudget},
		},
	})
}

func acquireClass(t *testing.T, g *Gate, id, class string) Permit {
	t.Helper()
	p, err := g.Acquire(WithClass(context.Background(), class), id)
	if err != nil {
		t.Fatalf("Acquire(%q, class %q): %v", id, class, err)
	}
	return p
}

func classStatOf(t *testing.T, g *Gate, id, class string) ClassStat {
	t.Helper()
	s, _ := g.TenantStat(id)
	for _, c := range s.Classes {
		if c.Class == class {
			return c
		}
	}
	t.Fatalf("no class %q in %+v", class, s.Classes)
	return ClassStat{}
}

// TestClassBudgetRejects: a tenant's work of a class with a budget is
// rejected for the budget, under the class's cap, once its own bucket is
// spent, with RetryAfter when it allows a call; the same tenant's work of
// another class or of the default class, and another tenant's work of the
// same class, are not (the bucket is per tenant and class); holds are
// charged at release, to the class's bucket, not to a tenant budget it
// has not got.
func TestClassBudgetRejects(t *testing.T) {
	g, clock := classBudgetGate(t, Budget{})
	p1, p2 := acquireClass(t, g, "a", "interactive"), acquireClass(t, g, "a", "interactive")
	_, err := g.Acquire(WithClass(context.Background(), "interactive"), "a")
	var ol *OverLimitError
	if !errors.As(err, &ol) || !errors.Is(err, ErrOverBudget) || ol.Cause != CauseBudget || ol.Class != "interactive" {
		t.Fatalf("third interactive request with 2 s of class budget and 2 permits out: %v, want a budget rejection of the class", err)
	}
	if ol.RetryAfter != time.Second {
		t.Errorf("RetryAfter %v, want 1s: the class's budget refills 1 s per second", ol.RetryAfter)
	}
	// Not the tenant's other work, nor the other tenant's.
	for _, o := range []struct{ id, class string }{{"a", DefaultClass}, {"a", "batch"}, {"b", "interactive"}} {
		acquireClass(t, g, o.id, o.class).Release()
	}
	clock.advance(3 * time.Second)
	p1.Release() // charged 1 s at grant; its 3 s hold costs 2 s more
	c := classStatOf(t, g, "a", "interactive")
	if !c.Budgeted || c.BudgetUsed != 3*time.Second || c.BudgetLeft != 0 || c.OverBudget != 1 || c.Rejected != 1 {
		t.Fatalf("after a 3 s hold: %+v; want Budgeted, BudgetUsed 3s, BudgetLeft 0, OverBudget 1, Rejected 1", c)
	}
	if s, _ := g.TenantStat("a"); s.Budgeted || s.OverBudget != 0 || s.BudgetUsed != 0 || s.Rejected != 1 {
		t.Fatalf("the tenant, without a budget of its own: Budgeted %v, OverBudget %d, BudgetUsed %v, Rejected %d; want false, 0, 0, 1",
			s.Budgeted, s.OverBudget, s.BudgetUsed, s.Rejected)
	}
	p2.Release() // -2 s: in debt
	if _, err := g.Acquire(WithClass(context.Background(), "interactive"), "a"); !errors.As(err, &ol) || ol.Cause != CauseBudget || ol.RetryAfter != 4*time.Second {
		t.Fatalf("2 s in debt: %v, want ErrOverBudget retrying after 4s", err)
	}
	clock.advance(4 * time.Second)
	acquireClass(t, g, "a", "interactive").Release()
	// The class's cap is still the cap's refusal.
	g2, _ := newTestGate(t, Config{Capacity: 20, Plans: map[string]Plan{"p": {MaxConns: 8}},
		Classes: map[string]Class{"interactive": {MaxConns: 1, Budget: Budget{Rate: 100}}}})
	q := acquireClass(t, g2, "a", "interactive")
	defer q.Release()
	if _, err := g2.Acquire(WithClass(context.Background(), "interactive"), "a"); !errors.As(err, &ol) || ol.Cause != CauseCap {
		t.Fatalf("at the class's cap with budget left: %v, want a cap rejection", err)
	}
}

// TestClassBudgetQueues: a request of a queueing class out of its class's
// budget waits in the class's queue and is admitted when that budget
// refills, with no release to wake it.
func TestClassBudgetQueues(t *testing.T) {
	g, clock := classBudgetGate(t, Budget{})
	p1, p2 := acquireClass(t, g, "a", "batch"), acquireClass(t, g, "a", "batch")
	done := make(chan result, 1)
	go func() {
		p, err := g.Acquire(WithClass(context.Background(), "batch"), "a")
		done <- result{p, err}
	}()
	waitUntil(t, "the third batch request waits", func() bool { return classStatOf(t, g, "a", "batch").Waiting == 1 })
	acquireClass(t, g, "a", DefaultClass).Release() // the tenant's other work passes it
	select {
	case r := <-done:
		t.Fatalf("admitted before the class's budget refilled: %v", r.err)
	default:
	}
	clock.advance(time.Second)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.p.Release()
	p1.Release()
	p2.Release()
	if c := classStatOf(t, g, "a", "batch"); c.InUse != 0 || c.Waiting != 0 || c.Acquired != 3 || c.OverBudget != 0 {
		t.Fatalf("after the queue drained: %+v", c)
	}
}

// TestClassAndTenantBudgets: a request of a class needs both its tenant's
// budget and its class's; each refusal is counted by the budget that made
// it, and each permit of the class is charged to both.
func TestClassAndTenantBudgets(t *testing.T) {
	g, clock := classBudgetGate(t, Budget{Rate: 1, Burst: 3 * time.Second})
	p1, p2 := acquireClass(t, g, "a", "interactive"), acquireClass(t, g, "a", "interactive") // class 0 s left, tenant 1 s
	var ol *OverLimitError
	if _, err := g.Acquire(WithClass(context.Background(), "interactive"), "a"); !errors.As(err, &ol) || ol.Cause != CauseBudget {
		t.Fatalf("class budget spent: %v, want a budget rejection", err)
	}
	p3 := acquireClass(t, g, "a", DefaultClass) // the tenant's last second
	if _, err := g.Acquire(context.Background(), "a"); !errors.As(err, &ol) || ol.Cause != CauseBudget {
		t.Fatalf("tenant budget spent: %v, want a budget rejection", err)
	}
	s, _ := g.TenantStat("a")
	c := classStatOf(t, g, "a", "interactive")
	if s.OverBudget != 1 || c.OverBudget != 1 || s.BudgetLeft != 0 || c.BudgetLeft != 0 {
		t.Fatalf("OverBudget tenant %d, class %d; BudgetLeft tenant %v, class %v; want 1, 1, 0s, 0s", s.OverBudget, c.OverBudget, s.BudgetLeft, c.BudgetLeft)
	}
	clock.advance(500 * time.Millisecond) // both refill 0.5 s, and each permit gives back 0.5 s of its 1 s charged
	p1.Release()
	p2.Release()
	p3.Release()
	s, _ = g.TenantStat("a")
	c = classStatOf(t, g, "a", "interactive")
	if s.BudgetUsed != 1500*time.Millisecond || c.BudgetUsed != time.Second || s.BudgetLeft != 2*time.Second || c.BudgetLeft != 1500*time.Millisecond {
		t.Fatalf("BudgetUsed tenant %v, class %v; BudgetLeft tenant %v, class %v; want 1.5s, 1s, 2s, 1.5s",
			s.BudgetUsed, c.BudgetUsed, s.BudgetLeft, c.BudgetLeft)
	}
}

// TestClassBudgetInvalid: a class budget out of range fails New.
func TestClassBudgetInvalid(t *testing.T) {
	_, err := New(Config{Capacity: 4, Classes: map[string]Class{"batch": {MaxConns: 1, Budget: Budget{Rate: -1}}}})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("negative class budget rate: %v, want ErrInvalidConfig", err)
	}
}
