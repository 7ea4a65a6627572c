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

// TestPermitHoldLimits: a permit carries its tenant's IdleInTransactionTimeout
// and MaxHold (Lookup's override, else the plan's), each lowered by its
// class's; negative ones are refused in a plan, a class and a Lookup
// answer; Exceeded counts per tenant and limit, and nothing after Release.
func TestPermitHoldLimits(t *testing.T) {
	ms := time.Millisecond
	g := mustNew(t, pool.Config{
		Capacity: 4,
		Plans: map[string]pool.Plan{
			"free": {MaxConns: 2, IdleInTransactionTimeout: 200 * ms, MaxHold: 2000 * ms},
			"paid": {MaxConns: 2},
		},
		DefaultPlan: "paid",
		Classes:     map[string]pool.Class{"report": {MaxConns: 1, IdleInTransactionTimeout: 100 * ms, MaxHold: 3000 * ms}},
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			switch id {
			case "free":
				return pool.Tenant{Plan: "free"}, nil
			case "override":
				return pool.Tenant{Plan: "free", IdleInTransactionTimeout: 50 * ms, MaxHold: 500 * ms}, nil
			case "bad-idle":
				return pool.Tenant{IdleInTransactionTimeout: -1}, nil
			case "bad-hold":
				return pool.Tenant{MaxHold: -1}, nil
			}
			return pool.Tenant{}, nil
		},
	})
	report := pool.WithClass(context.Background(), "report")
	for _, c := range []struct {
		ctx        context.Context
		id         string
		idle, hold time.Duration
	}{
		{context.Background(), "free", 200 * ms, 2000 * ms},
		{context.Background(), "paid", 0, 0},
		{context.Background(), "override", 50 * ms, 500 * ms},
		{report, "free", 100 * ms, 2000 * ms},
		{report, "paid", 100 * ms, 3000 * ms},
		{report, "override", 50 * ms, 500 * ms},
	} {
		p, err := g.Acquire(c.ctx, c.id)
		if err != nil {
			t.Fatal(err)
		}
		if idle, hold := p.IdleInTransactionTimeout(), p.MaxHold(); idle != c.idle || hold != c.hold {
			t.Errorf("tenant %s: IdleInTransactionTimeout %v, MaxHold %v, want %v, %v", c.id, idle, hold, c.idle, c.hold)
		}
		p.Release()
	}
	for _, id := range []string{"bad-idle", "bad-hold"} {
		if _, err := g.Acquire(context.Background(), id); !errors.Is(err, pool.ErrInvalidConfig) {
			t.Errorf("Lookup's %s: %v, want ErrInvalidConfig", id, err)
		}
	}
	if z := (pool.Permit{}); z.IdleInTransactionTimeout() != 0 || z.MaxHold() != 0 {
		t.Error("the zero Permit has hold limits")
	}
	z := pool.Permit{}
	z.Exceeded(pool.LimitMaxHold) // does nothing

	p, err := g.Acquire(context.Background(), "free")
	if err != nil {
		t.Fatal(err)
	}
	p.Exceeded(pool.LimitStatement)
	p.Exceeded(pool.LimitStatement)
	p.Exceeded(pool.LimitIdleInTransaction)
	p.Release()
	p.Exceeded(pool.LimitMaxHold) // after Release: not counted
	s, _ := g.TenantStat("free")
	if s.StatementTimeouts != 2 || s.IdleTimeouts != 1 || s.HoldTimeouts != 0 {
		t.Errorf("TenantStat counts %d statement, %d idle, %d hold timeouts, want 2, 1, 0",
			s.StatementTimeouts, s.IdleTimeouts, s.HoldTimeouts)
	}

	for name, cfg := range map[string]pool.Config{
		"Plan.IdleInTransactionTimeout": {Capacity: 1, Plans: map[string]pool.Plan{"p": {MaxConns: 1, IdleInTransactionTimeout: -1}}},
		"Plan.MaxHold":                  {Capacity: 1, Plans: map[string]pool.Plan{"p": {MaxConns: 1, MaxHold: -ms}}},
		"Class.IdleInTransactionTimeout": {Capacity: 1, Plans: map[string]pool.Plan{"p": {MaxConns: 1}},
			Classes: map[string]pool.Class{"c": {MaxConns: 1, IdleInTransactionTimeout: -1}}},
		"Class.MaxHold": {Capacity: 1, Plans: map[string]pool.Plan{"p": {MaxConns: 1}},
			Classes: map[string]pool.Class{"c": {MaxConns: 1, MaxHold: -1}}},
	} {
		if _, err := pool.New(cfg); !errors.Is(err, pool.ErrInvalidConfig) {
			t.Errorf("a negative %s: %v, want ErrInvalidConfig", name, err)
		}
	}
}
