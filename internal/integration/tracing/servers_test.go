package tracing_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
)

// TestServersMetrics: with tenantdb.NewServers, ObservePool reports each
// server's open connections against its budget, whether it is down, and each
// database's connections with its server. Both servers are the test's one
// PostgreSQL under two names: the metrics are the Pool's, not the server's.
func TestServersMetrics(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, tracing.WithPoolName("orders"))
	servers := map[string]*pgxpool.Config{}
	for name, budget := range map[string]int32{"s0": 3, "s1": 2} {
		c, err := pgxpool.ParseConfig(postgres(t).DSN)
		if err != nil {
			t.Fatal(err)
		}
		c.MaxConns = budget
		servers[name] = c
	}
	p, err := tenantdb.NewServers(ctx, servers, tenantdb.Config{
		Tracer: e.tr,
		Placement: func(_ context.Context, id string) (tenantdb.Placement, error) {
			return tenantdb.Placement{Server: map[string]string{"acme": "s0", "globex": "s1"}[id]}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	stop, err := e.tr.ObservePool(p)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for _, tenant := range []string{"acme", "globex"} {
		if _, err := p.Exec(tenantdb.WithTenant(ctx, tenant), "select 1"); err != nil {
			t.Fatal(err)
		}
	}
	tenantdbtest.Eventually(t, time.Minute, "both servers' connections are idle", func() bool {
		for _, db := range p.AppendDatabaseStat(nil) {
			if db.InUse != 0 {
				return false
			}
		}
		return true
	})
	rm := e.collect(t)
	name := semconv.DBClientConnectionPoolName("orders")
	for server, want := range map[string][2]float64{"s0": {1, 3}, "s1": {1, 2}} {
		key := tracing.ServerKey.String(server)
		got := [2]float64{
			value(t, rm, "tenantdb.server.connection.count", name, key).value,
			value(t, rm, "tenantdb.server.connection.max", name, key).value,
		}
		if got != want {
			t.Errorf("%s: open and budget %v, want %v", server, got, want)
		}
		if v := value(t, rm, "tenantdb.server.down", name, key).value; v != 0 {
			t.Errorf("%s: down %v, want 0", server, v)
		}
		db := semconv.DBNamespace(servers[server].ConnConfig.Database)
		if v := value(t, rm, "tenantdb.database.connection.count", name, db, key, semconv.DBClientConnectionStateIdle).value; v != 1 {
			t.Errorf("%s: its database's idle connections %v, want 1", server, v)
		}
	}
	if got := value(t, rm, "db.client.connection.max", name).value; got != 5 {
		t.Errorf("max %v, want the budgets' sum 5", got)
	}
}

// TestReplicaMetrics: a replica (tenantdb.WithReplicas) is a series of the
// server metrics of its own, named "s0/replica0": its open connections, its
// budget, and 1 as down while it takes no reads. The test's "replica" is the
// test's one PostgreSQL, not in recovery, so the probe finds it unusable and
// no lag is reported.
func TestReplicaMetrics(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, tracing.WithPoolName("orders"))
	cfgOf := func(budget int32) *pgxpool.Config {
		c, err := pgxpool.ParseConfig(postgres(t).DSN)
		if err != nil {
			t.Fatal(err)
		}
		c.MaxConns = budget
		return c
	}
	p, err := tenantdb.NewServers(ctx, map[string]*pgxpool.Config{"s0": cfgOf(3)}, tenantdb.Config{
		Tracer: e.tr,
		Placement: func(context.Context, string) (tenantdb.Placement, error) {
			return tenantdb.Placement{Server: "s0"}, nil
		},
	}, tenantdb.WithReplicas("s0", tenantdb.Replicas{Configs: []*pgxpool.Config{cfgOf(2)}, MaxLag: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	stop, err := e.tr.ObservePool(p)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	tenantdbtest.Eventually(t, time.Minute, "the probe finds the replica not in recovery", func() bool {
		return strings.Contains(p.ServersStat()[0].Replicas[0].Why, "not in recovery")
	})
	rm := e.collect(t)
	name := semconv.DBClientConnectionPoolName("orders")
	key := tracing.ServerKey.String("s0/replica0")
	got := [3]float64{
		value(t, rm, "tenantdb.server.connection.count", name, key).value,
		value(t, rm, "tenantdb.server.connection.max", name, key).value,
		value(t, rm, "tenantdb.server.down", name, key).value,
	}
	if want := [3]float64{0, 2, 1}; got != want {
		t.Errorf("s0/replica0: open, budget and down %v, want %v", got, want)
	}
	if v := value(t, rm, "tenantdb.server.connection.max", name, tracing.ServerKey.String("s0")).value; v != 3 {
		t.Errorf("s0: budget %v, want 3", v)
	}
}
