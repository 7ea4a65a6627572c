package tenantdb_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestRunnerOnThePoolsOwnGateFailsLoudly: a pool.Runner given the Pool's own
// Gate holds, in each job's permit, the slot the job's statements need. With
// MaxConns 1 a job's p.Exec must fail with pool.ErrRunnerOwnGate, which says
// what to do, not with an over-limit error that looks like load; the same
// jobs on a Runner with a Gate of its own all succeed.
func TestRunnerOnThePoolsOwnGateFailsLoudly(t *testing.T) {
	p := newPool(t, sharedPG, 4, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"one": {MaxConns: 1}}, DefaultPlan: "one"})
	run := func(g *pool.Gate) []error {
		var mu sync.Mutex
		var errs []error
		r, err := pool.NewRunner(pool.RunnerConfig{Gate: g})
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			if err := r.Submit(context.Background(), "acme", func(ctx context.Context) {
				_, err := p.Exec(ctx, "select 1")
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}); err != nil {
				t.Fatal(err)
			}
		}
		if dropped, err := r.Close(context.Background()); dropped != 0 || err != nil {
			t.Fatalf("Close: %d, %v", dropped, err)
		}
		return errs
	}
	for i, err := range run(p.Gate()) {
		if !errors.Is(err, pool.ErrRunnerOwnGate) {
			t.Fatalf("job %d on the Pool's own Gate: %v; want ErrRunnerOwnGate", i, err)
		}
	}
	own, err := pool.New(pool.Config{Capacity: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	for i, err := range run(own) {
		if err != nil {
			t.Fatalf("job %d on a Gate of its own: %v", i, err)
		}
	}
	assertNothingHeld(t, p)
}
