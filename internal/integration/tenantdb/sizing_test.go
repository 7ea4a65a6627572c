package tenantdb_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

func newLazyPool(t *testing.T, maxConns int32, cfg tenantdb.Config) (*tenantdb.Pool, *bytes.Buffer) {
	t.Helper()
	var log bytes.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	p, err := tenantdb.New(context.Background(), lazyConfig(t, maxConns), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, &log
}

func TestSizingReport(t *testing.T) {
	t.Run("fits", func(t *testing.T) {
		p, log := newLazyPool(t, 20, tenantdb.Config{
			Plans: map[string]tenantdb.Plan{
				"free":       {MaxConns: 2},
				"standard":   {MaxConns: 5},
				"enterprise": {MaxConns: 10, Weight: 5, ReservedConns: 4},
			},
			DefaultPlan:          "standard",
			TypicalActiveTenants: 4,
		})
		c := p.Sizing()
		if len(c.Warnings) != 0 || log.Len() != 0 {
			t.Fatalf("warnings for a configuration that fits: %q; logged %q", c.Warnings, log)
		}
		if c.MaxConns != 20 || c.MaxReserved != 10 || c.DefaultPlan != "standard" || c.TypicalDemand != 20 {
			t.Fatalf("report: %+v", c)
		}
		want := []tenantdb.PlanSizing{
			{Name: "enterprise", MaxConns: 10, ReservedConns: 4, Weight: 5, TenantsToFill: 2, SustainedTenantsToFill: 2},
			{Name: "free", MaxConns: 2, Weight: 1, TenantsToFill: 10, SustainedTenantsToFill: 10},
			{Name: "standard", MaxConns: 5, Weight: 1, TenantsToFill: 4, SustainedTenantsToFill: 4},
		}
		for i := range want {
			if c.Plans[i] != want[i] {
				t.Errorf("plan %d: %+v, want %+v", i, c.Plans[i], want[i])
			}
		}
	})
	t.Run("typical tenants do not fit", func(t *testing.T) {
		p, log := newLazyPool(t, 20, tenantdb.Config{
			Plans:                map[string]tenantdb.Plan{"standard": {MaxConns: 10}},
			TypicalActiveTenants: 3,
		})
		c := p.Sizing()
		if c.TypicalDemand != 30 || len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "may hold 30 connections, more than MaxConns 20") {
			t.Fatalf("report: %+v", c)
		}
		if !strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), "more than MaxConns 20") {
			t.Fatalf("New logged %q, want the warning", log)
		}
	})
	t.Run("one tenant can take every connection", func(t *testing.T) {
		p, _ := newLazyPool(t, 8, tenantdb.Config{Plans: map[string]tenantdb.Plan{"big": {MaxConns: 8}, "small": {MaxConns: 2}}, DefaultPlan: "small"})
		if w := p.Sizing().Warnings; len(w) != 1 || !strings.Contains(w[0], `plan "big": one busy tenant can hold all 8`) {
			t.Fatalf("warnings: %q", w)
		}
		// A reservation for the other plan answers it.
		p, _ = newLazyPool(t, 8, tenantdb.Config{Plans: map[string]tenantdb.Plan{"big": {MaxConns: 8}, "small": {MaxConns: 2, ReservedConns: 2}}, DefaultPlan: "small"})
		if w := p.Sizing().Warnings; len(w) != 0 {
			t.Fatalf("warnings with a reservation: %q", w)
		}
	})
	t.Run("active tenants now", func(t *testing.T) {
		p, _ := newLazyPool(t, 20, tenantdb.Config{
			Plans:       map[string]tenantdb.Plan{"free": {MaxConns: 2}, "standard": {MaxConns: 5, ReservedConns: 1}},
			DefaultPlan: "free",
			Lookup: func(_ context.Context, id string) (tenantdb.Tenant, error) {
				if id == "acme" {
					return tenantdb.Tenant{Plan: "standard"}, nil
				}
				return tenantdb.Tenant{}, nil
			},
		})
		var held []pool.Permit
		for _, id := range []string{"acme", "acme", "globex", "initech"} {
			permit, err := p.Gate().Acquire(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, permit)
		}
		held[3].Release() // initech is tracked but idle
		c := p.Sizing()
		if c.ActiveTenants != 2 || c.ActiveDemand != 5+2 {
			t.Fatalf("active %d tenants with caps adding up to %d; want 2 and 7", c.ActiveTenants, c.ActiveDemand)
		}
		if c.Reserved != 1 {
			t.Fatalf("Reserved = %d, want acme's 1", c.Reserved)
		}
		for _, permit := range held {
			permit.Release()
		}
		if c := p.Sizing(); c.ActiveTenants != 0 || c.ActiveDemand != 0 {
			t.Fatalf("after release: %+v", c)
		}
	})
	t.Run("budgets", func(t *testing.T) {
		// A cap of 8 with a budget of 2 conn-s/s: one tenant fills the pool
		// for its burst, four over longer periods; three typical tenants
		// may hold 24 at once, 6 on average.
		p, _ := newLazyPool(t, 8, tenantdb.Config{
			Plans:                map[string]tenantdb.Plan{"metered": {MaxConns: 8, Budget: pool.Budget{Rate: 2}}},
			TypicalActiveTenants: 3,
		})
		c := p.Sizing()
		if pl := c.Plans[0]; pl.TenantsToFill != 1 || pl.SustainedTenantsToFill != 4 || pl.BudgetRate != 2 {
			t.Errorf("plan: %+v, want TenantsToFill 1, SustainedTenantsToFill 4, BudgetRate 2", pl)
		}
		if c.TypicalDemand != 24 || c.TypicalSustained != 6 {
			t.Errorf("typical demand %d, sustained %v; want 24 and 6", c.TypicalDemand, c.TypicalSustained)
		}
		if len(c.Warnings) != 2 || !strings.Contains(c.Warnings[0], "for as long as its Budget's Burst lasts (2 on average)") ||
			!strings.Contains(c.Warnings[1], "may hold 24 connections at once (6 on average under its Budget)") {
			t.Errorf("warnings: %q", c.Warnings)
		}
		permit, err := p.Gate().Acquire(context.Background(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		defer permit.Release()
		if c := p.Sizing(); c.ActiveDemand != 8 || c.ActiveSustained != 2 {
			t.Errorf("active demand %d, sustained %v; want 8 and 2", c.ActiveDemand, c.ActiveSustained)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		_, err := tenantdb.New(context.Background(), lazyConfig(t, 20), tenantdb.Config{TypicalActiveTenants: -1})
		if !errors.Is(err, pool.ErrInvalidConfig) {
			t.Fatalf("err = %v, want ErrInvalidConfig", err)
		}
	})
}

func TestCheckServer(t *testing.T) {
	p := newPool(t, sharedPG, 4, tenantdb.Config{})
	s, err := p.CheckServer(as("acme"), 1)
	if err != nil {
		t.Fatal(err)
	}
	// tenantdbtest starts the server with max_connections 300; 3 are
	// reserved for superusers by default.
	if s.MaxConnections != 297 || s.Demand != 4 || !s.Fits() {
		t.Fatalf("one process: %+v", s)
	}
	if s, err = p.CheckServer(context.Background(), 100); err != nil || s.Demand != 400 || s.Fits() {
		t.Fatalf("100 processes of 4 connections: %+v, %v", s, err)
	}
	if _, err := p.CheckServer(context.Background(), 0); err == nil {
		t.Fatal("0 processes accepted")
	}
	if s := p.TenantStat("acme"); s.Acquired != 0 {
		t.Fatalf("CheckServer counted against the tenant in its context: %+v", s)
	}
	assertNothingHeld(t, p)
}
