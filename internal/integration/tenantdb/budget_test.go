package tenantdb_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestBudgetConnectionTime: a tenant with a cap of 10 and a budget of 2
// connection-seconds per second (burst 2 s), whose 10 workers run 1 s
// queries in a loop for budgetRun, holds Rate × budgetRun + Burst of
// connection-time ± 10% (calls admitted within the run, each held to its
// end), while a tenant on a plan with the same cap and no budget, beside it
// on the same pool, holds about its cap's worth: the budget, not the pool,
// is what stops the first. Holds are measured by the gate (TenantStat),
// exactly, since a budget times every permit.
func TestBudgetConnectionTime(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for budgetRun")
	}
	const budgetRun = 10 * time.Second
	budget := pool.Budget{Rate: 2, Burst: 2 * time.Second}
	p := newPool(t, sharedPG, 24, tenantdb.Config{
		Plans: map[string]pool.Plan{
			"metered": {MaxConns: 10, MaxWaiting: 10, Budget: budget},
			"capped":  {MaxConns: 10, MaxWaiting: 10},
		},
		DefaultPlan: "capped",
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			if id == "metered" {
				return pool.Tenant{Plan: "metered"}, nil
			}
			return pool.Tenant{}, nil
		},
	})
	start := time.Now()
	end := start.Add(budgetRun)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for _, tenant := range []string{"metered", "capped"} {
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					// Only the admission is bounded by the run: a call
					// admitted in it runs to its end.
					ctx, cancel := context.WithDeadline(as(tenant), end)
					c, err := p.Acquire(ctx)
					cancel()
					if err != nil {
						if !errors.Is(err, context.DeadlineExceeded) {
							errs <- err
						}
						return
					}
					_, err = c.Exec(as(tenant), "select pg_sleep(1)")
					c.Release()
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	metered, capped := p.TenantStat("metered"), p.TenantStat("capped")
	want := time.Duration(budget.Rate*float64(budgetRun)) + budget.Burst
	t.Logf("in %v: metered held %v (budget %v, used %v, refused %d, acquired %d), capped held %v (acquired %d)",
		budgetRun, metered.HoldTime.Round(time.Millisecond), want, metered.BudgetUsed.Round(time.Millisecond),
		metered.OverBudget, metered.Acquired, capped.HoldTime.Round(time.Millisecond), capped.Acquired)
	// The budget charges a hold when it ends, so the calls it admits at
	// once may overshoot it by their holds (by 10% with 1 s statements) and
	// the run's end may fall between two such waves: either by what a
	// slower machine adds to each of the cap's 10 holds.
	slower := 10 * max(0, metered.HoldTime/time.Duration(max(metered.Acquired, 1))-time.Second)
	if d := metered.HoldTime - want; d < -want/10-slower || d > want/10+slower {
		t.Errorf("the metered tenant held %v of connection-time in %d calls, want %v ± 10%% (± %v more for holds longer than 1 s)",
			metered.HoldTime, metered.Acquired, want, slower)
	}
	if metered.BudgetUsed != metered.HoldTime {
		t.Errorf("budget charged %v, held %v: every hold must be charged", metered.BudgetUsed, metered.HoldTime)
	}
	if capped.HoldTime < 3*metered.HoldTime {
		t.Errorf("the tenant without a budget held %v, not much more than the metered one's %v: "+
			"something other than the budget limited the metered tenant", capped.HoldTime, metered.HoldTime)
	}
	assertNothingHeld(t, p)
}

// TestClassBudget: a class's Budget meters each tenant's work of the class
// on its own, beside the tenant's other work. Five workers of a tenant's
// "batch" class (budget 1 connection-second per second, burst 1 s, a queue)
// running 250 ms queries for classRun hold about Rate × classRun + Burst,
// while five workers of the same tenant's default class, with no budget,
// hold about their cap's worth beside them; then an "interactive" call
// past its class's budget is rejected for the budget, naming the class,
// with a RetryAfter, while the tenant's default class still runs.
func TestClassBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for classRun")
	}
	const classRun = 4 * time.Second
	budget := pool.Budget{Rate: 1, Burst: time.Second}
	p := newPool(t, sharedPG, 24, tenantdb.Config{
		Plans:       map[string]pool.Plan{"plan": {MaxConns: 10, MaxWaiting: 10}},
		DefaultPlan: "plan",
		Classes: map[string]tenantdb.Class{
			"batch":       {MaxConns: 5, MaxWaiting: 10, MaxWait: time.Minute, Budget: budget},
			"interactive": {MaxConns: 4, Budget: pool.Budget{Rate: 0.05, Burst: 100 * time.Millisecond}},
		},
	})
	end := time.Now().Add(classRun)
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for _, class := range []string{"batch", tenantdb.DefaultClass} {
		for range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					ctx, cancel := context.WithDeadline(tenantdb.WithClass(as("acme"), class), end)
					c, err := p.Acquire(ctx) // only the admission is bounded by the run
					cancel()
					if err != nil {
						if !errors.Is(err, context.DeadlineExceeded) {
							errs <- err
						}
						return
					}
					_, err = c.Exec(as("acme"), "select pg_sleep(0.25)")
					c.Release()
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	classOf := func(name string) pool.ClassStat {
		for _, c := range p.TenantStat("acme").Classes {
			if c.Class == name {
				return c
			}
		}
		t.Fatalf("no class %q", name)
		return pool.ClassStat{}
	}
	batch, plain := classOf("batch"), classOf(tenantdb.DefaultClass)
	want := time.Duration(budget.Rate*float64(classRun)) + budget.Burst
	t.Logf("in %v: batch held %v in %d calls (budget %v, used %v), the default class %v in %d calls",
		classRun, batch.HoldTime.Round(time.Millisecond), batch.Acquired, want, batch.BudgetUsed.Round(time.Millisecond),
		plain.HoldTime.Round(time.Millisecond), plain.Acquired)
	// The calls admitted at once may overshoot by their holds, as in
	// TestBudgetConnectionTime: five of them, each as long as the machine
	// makes it.
	over := 5 * batch.HoldTime / time.Duration(max(batch.Acquired, 1))
	if !batch.Budgeted || batch.HoldTime > want+want/10+over || batch.HoldTime < want-want/10-over {
		t.Errorf("batch held %v of connection-time, want %v ± 10%% ± %v", batch.HoldTime, want, over)
	}
	if batch.BudgetUsed != batch.HoldTime {
		t.Errorf("batch's budget charged %v, held %v: every hold must be charged", batch.BudgetUsed, batch.HoldTime)
	}
	// Compared in calls, which are all the same statement: a class with no
	// budget has its holds timed one in sixteen (pool's sampled hold
	// times), so its HoldTime moves in steps of sixteen holds.
	if plain.Acquired < 2*batch.Acquired {
		t.Errorf("the default class made %d calls beside batch's %d, with the same workers and cap: something other than the class budget limited batch",
			plain.Acquired, batch.Acquired)
	}
	if s := p.TenantStat("acme"); s.Budgeted || s.OverBudget != 0 {
		t.Errorf("the tenant has no budget of its own: Budgeted %v, OverBudget %d", s.Budgeted, s.OverBudget)
	}

	// Interactive: 100 ms of burst, spent (and more) by one 200 ms call.
	interactive := tenantdb.WithClass(as("acme"), "interactive")
	if _, err := p.Exec(interactive, "select pg_sleep(0.2)"); err != nil {
		t.Fatal(err)
	}
	_, err := p.Exec(interactive, "select 1")
	var ol *pool.OverLimitError
	if !errors.As(err, &ol) || !errors.Is(err, pool.ErrOverBudget) || ol.Cause != pool.CauseBudget || ol.Class != "interactive" || ol.RetryAfter <= 0 {
		t.Fatalf("an interactive call past its class's budget: %v, want a budget rejection of class interactive with a RetryAfter", err)
	}
	if _, err := p.Exec(as("acme"), "select 1"); err != nil {
		t.Fatalf("the tenant's default class beside its spent interactive budget: %v", err)
	}
	if c := classOf("interactive"); c.OverBudget != 1 || c.Rejected != 1 {
		t.Errorf("interactive: OverBudget %d, Rejected %d; want 1, 1", c.OverBudget, c.Rejected)
	}
	assertNothingHeld(t, p)
}
