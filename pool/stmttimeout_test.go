package pool_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

// TestPermitStatementTimeout: a permit carries its tenant's statement
// timeout (Lookup's override, else the plan's), lowered by its class's, and
// a negative one is refused.
func TestPermitStatementTimeout(t *testing.T) {
	g := mustNew(t, pool.Config{
		Capacity: 4,
		Plans: map[string]pool.Plan{
			"free": {MaxConns: 2, StatementTimeout: 200 * time.Millisecond},
			"paid": {MaxConns: 2},
		},
		DefaultPlan: "paid",
		Classes:     map[string]pool.Class{"report": {MaxConns: 1, StatementTimeout: 100 * time.Millisecond}},
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			switch id {
			case "free":
				return pool.Tenant{Plan: "free"}, nil
			case "override":
				return pool.Tenant{Plan: "free", StatementTimeout: 50 * time.Millisecond}, nil
			case "bad":
				return pool.Tenant{StatementTimeout: -1}, nil
			}
			return pool.Tenant{}, nil
		},
	})
	report := pool.WithClass(context.Background(), "report")
	for _, c := range []struct {
		ctx  context.Context
		id   string
		want time.Duration
	}{
		{context.Background(), "free", 200 * time.Millisecond},
		{context.Background(), "paid", 0},
		{context.Background(), "override", 50 * time.Millisecond},
		{report, "free", 100 * time.Millisecond},
		{report, "paid", 100 * time.Millisecond},
		{report, "override", 50 * time.Millisecond},
	} {
		p, err := g.Acquire(c.ctx, c.id)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.StatementTimeout(); got != c.want {
			t.Errorf("tenant %s: StatementTimeout %v, want %v", c.id, got, c.want)
		}
		p.Release()
	}
	if _, err := g.Acquire(context.Background(), "bad"); !errors.Is(err, pool.ErrInvalidConfig) {
		t.Errorf("a negative Lookup StatementTimeout: %v, want ErrInvalidConfig", err)
	}
	if (pool.Permit{}).StatementTimeout() != 0 {
		t.Error("the zero Permit has a statement timeout")
	}
	if _, err := pool.New(pool.Config{Capacity: 1, Plans: map[string]pool.Plan{"p": {MaxConns: 1, StatementTimeout: -1}}}); !errors.Is(err, pool.ErrInvalidConfig) {
		t.Errorf("a negative Plan.StatementTimeout: %v, want ErrInvalidConfig", err)
	}
}
