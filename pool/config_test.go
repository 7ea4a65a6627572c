package pool_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

func TestConfigValidation(t *testing.T) {
	plans := func(p pool.Plan) map[string]pool.Plan { return map[string]pool.Plan{"p": p} }
	for _, tc := range []struct {
		name string
		cfg  pool.Config
		want string // in the message
	}{
		{"no capacity", pool.Config{}, "Capacity"},
		{"negative capacity", pool.Config{Capacity: -1}, "Capacity"},
		{"cap above capacity", pool.Config{Capacity: 10, Plans: plans(pool.Plan{MaxConns: 11})}, "above the capacity"},
		{"zero cap", pool.Config{Capacity: 10, Plans: plans(pool.Plan{})}, "MaxConns must be positive"},
		{"negative waiting", pool.Config{Capacity: 10, Plans: plans(pool.Plan{MaxConns: 1, MaxWaiting: -2})}, "MaxWaiting"},
		{"negative wait", pool.Config{Capacity: 10, Plans: plans(pool.Plan{MaxConns: 1, MaxWait: -time.Second})}, "MaxWait"},
		{"weight", pool.Config{Capacity: 10, Plans: plans(pool.Plan{MaxConns: 1, Weight: pool.MaxWeight + 1})}, "Weight"},
		{"negative reserve", pool.Config{Capacity: 10, Plans: plans(pool.Plan{MaxConns: 1, ReservedConns: -1})}, "ReservedConns"},
		{"reserve above cap", pool.Config{Capacity: 10, Plans: plans(pool.Plan{MaxConns: 2, ReservedConns: 3})}, "above its MaxConns"},
		{"reserve above MaxReserved", pool.Config{Capacity: 10, Plans: plans(pool.Plan{MaxConns: 8, ReservedConns: 6})}, "MaxReserved"},
		{"MaxReserved above capacity", pool.Config{Capacity: 10, MaxReserved: 11}, "MaxReserved"},
		{"unknown default plan", pool.Config{Capacity: 10, Plans: map[string]pool.Plan{"a": {MaxConns: 1}, "b": {MaxConns: 1}}, DefaultPlan: "c"}, `"c"`},
		{"ambiguous default plan", pool.Config{Capacity: 10, Plans: map[string]pool.Plan{"a": {MaxConns: 1}, "b": {MaxConns: 1}}}, "DefaultPlan"},
		{"empty plan name", pool.Config{Capacity: 10, Plans: map[string]pool.Plan{"": {MaxConns: 1}}}, "empty name"},
		{"negative IdleTTL", pool.Config{Capacity: 10, IdleTTL: -1}, "IdleTTL"},
		{"negative MaxTenants", pool.Config{Capacity: 10, MaxTenants: -1}, "MaxTenants"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pool.New(tc.cfg)
			if !errors.Is(err, pool.ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %q, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 20})
	for range 10 {
		mustAcquire(t, g, "acme")
	}
	if _, err := g.Acquire(t.Context(), "acme"); !errors.Is(err, pool.ErrOverLimit) {
		t.Fatalf("default plan is half the capacity, rejecting over it; got %v", err)
	}
	if s, _ := g.TenantStat("acme"); s.Plan != "default" || s.Limit != 10 {
		t.Fatalf("stats = %+v", s)
	}
}
