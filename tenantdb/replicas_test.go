package tenantdb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

func TestReadOnlyMark(t *testing.T) {
	ctx := context.Background()
	if tenantdb.IsReadOnly(ctx) || !tenantdb.IsReadOnly(tenantdb.ReadOnly(ctx)) {
		t.Fatal("ReadOnly does not mark the context, or a bare one is marked")
	}
}

// TestWithReplicasRejectsBadConfigs checks that NewServers starts nothing
// for replicas it cannot use.
func TestWithReplicasRejectsBadConfigs(t *testing.T) {
	cfgOf := func(maxConns int32) *pgxpool.Config {
		c, err := pgxpool.ParseConfig("postgres://u:p@127.0.0.1:1/db?connect_timeout=1")
		if err != nil {
			t.Fatal(err)
		}
		c.MaxConns = maxConns
		return c
	}
	withMin := cfgOf(2)
	withMin.MinConns = 1
	for name, r := range map[string]struct {
		server string
		r      tenantdb.Replicas
	}{
		"unknown server":      {"s9", tenantdb.Replicas{Configs: []*pgxpool.Config{cfgOf(2)}}},
		"no configs":          {"s0", tenantdb.Replicas{}},
		"nil config":          {"s0", tenantdb.Replicas{Configs: []*pgxpool.Config{nil}}},
		"MinConns":            {"s0", tenantdb.Replicas{Configs: []*pgxpool.Config{withMin}}},
		"negative MaxLag":     {"s0", tenantdb.Replicas{Configs: []*pgxpool.Config{cfgOf(2)}, MaxLag: -1}},
		"probe not below lag": {"s0", tenantdb.Replicas{Configs: []*pgxpool.Config{cfgOf(2)}, MaxLag: time.Second, ProbeEvery: time.Second}},
		"unknown fallback":    {"s0", tenantdb.Replicas{Configs: []*pgxpool.Config{cfgOf(2)}, Unavailable: 7}},
		"unknown class":       {"s0", tenantdb.Replicas{Configs: []*pgxpool.Config{cfgOf(2)}, Classes: []string{"reports"}}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := tenantdb.NewServers(context.Background(), map[string]*pgxpool.Config{"s0": cfgOf(4)}, tenantdb.Config{
				Plans: map[string]tenantdb.Plan{"p": {MaxConns: 2}},
				Placement: func(context.Context, string) (tenantdb.Placement, error) {
					return tenantdb.Placement{Server: "s0"}, nil
				},
			}, tenantdb.WithReplicas(r.server, r.r))
			if !errors.Is(err, pool.ErrInvalidConfig) {
				t.Fatalf("got %v, want pool.ErrInvalidConfig", err)
			}
		})
	}
}
