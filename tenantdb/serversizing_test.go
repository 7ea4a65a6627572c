package tenantdb_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestSizingWarnsPerServer checks the plan warning against each server's
// budget: a cap of 4 fills the server of budget 4, not the one of 8, nor
// the budgets' sum of 12.
func TestSizingWarnsPerServer(t *testing.T) {
	servers := map[string]*pgxpool.Config{}
	for name, budget := range map[string]int32{"small": 4, "large": 8} {
		c, err := pgxpool.ParseConfig("postgres://u:p@127.0.0.1:1/db")
		if err != nil {
			t.Fatal(err)
		}
		c.MaxConns = budget
		servers[name] = c
	}
	p, err := tenantdb.NewServers(context.Background(), servers, tenantdb.Config{
		Plans:       map[string]tenantdb.Plan{"p": {MaxConns: 4}},
		DefaultPlan: "p",
		Placement: func(context.Context, string) (tenantdb.Placement, error) {
			return tenantdb.Placement{Server: "small"}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	w := p.Sizing().Warnings
	if len(w) != 1 || !strings.Contains(w[0], `server "small" can hold all 4`) {
		t.Fatalf("warnings %q: want one, for the server of budget 4", w)
	}
}
