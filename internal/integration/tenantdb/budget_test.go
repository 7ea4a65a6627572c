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
