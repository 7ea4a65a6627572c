package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
)

// labels returns the distinct values of key among name's points.
func labels(t testing.TB, rm metricdata.ResourceMetrics, name string, key attribute.Key) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, p := range points(t, rm, name) {
		v, ok := p.attrs.Value(key)
		if !ok {
			t.Fatalf("%s: a point without %s: %v", name, key, p.attrs)
		}
		out[v.AsString()] = true
	}
	return out
}

var (
	gaugeMetrics = []string{"tenantdb.tenant.connection.count", "tenantdb.tenant.connection.pending_requests"}
	pushMetrics  = []string{"tenantdb.tenant.connection.wait_time", "tenantdb.tenant.connection.use_time",
		"tenantdb.tenant.connection.rejections"}
)

// TestSeriesBoundUnderTenantFlood sends 10,000 distinct tenants through a
// Gate, with a moving handful of them busy and some of each rejected, and
// collects a hundred times along the way. In each cardinality mode the
// number of labels per instrument must stay within the mode's bound, and
// reach it, so that the labels are neither unbounded nor lost.
func TestSeriesBoundUnderTenantFlood(t *testing.T) {
	const (
		tenants = 10_000
		busy    = 8 // permits held at once, by the latest tenants
	)
	plans := map[string]pool.Plan{
		"free": {MaxConns: 1}, "standard": {MaxConns: 1}, "enterprise": {MaxConns: 1},
	}
	planOf := []string{"free", "standard", "enterprise"}
	for _, c := range []struct {
		card tracing.Cardinality
		key  attribute.Key
		// Labels per instrument: in one collection's gauges, and in the
		// cumulative counters and histograms at the end.
		gauge, push int
	}{
		{tracing.ByTenant(50), tracing.TenantKey, 51, 51},
		{tracing.ByPlan(), tracing.PlanKey, 4, 3}, // the gauges always report "other", as zeros here
		{tracing.TopTenants(5, 20), tracing.TenantKey, 6, 21},
	} {
		t.Run(c.card.String(), func(t *testing.T) {
			e := newEnv(t, tracing.WithCardinality(c.card))
			g := newGate(t, e.tr, pool.Config{
				Capacity: busy * 2, Plans: plans, DefaultPlan: "free",
				Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
					var n int
					fmt.Sscanf(id, "t%d", &n)
					return pool.Tenant{Plan: planOf[n%len(planOf)]}, nil
				},
			})
			stop, err := e.tr.ObserveGate(g)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			ctx := context.Background()
			var held []pool.Permit
			for i := range tenants {
				id := fmt.Sprintf("t%05d", i)
				held = append(held, mustAcquire(t, ctx, g, id))
				if len(held) > busy {
					if i%7 == 0 { // the oldest holder asks again, over its cap of 1: rejected
						old := fmt.Sprintf("t%05d", i-busy)
						if _, err := g.Acquire(ctx, old); !errors.Is(err, pool.ErrOverLimit) {
							t.Fatalf("%s over its cap: %v", old, err)
						}
					}
					held[0].Release()
					held = held[1:]
				}
				if i%100 == 99 {
					rm := e.collect(t)
					for _, name := range gaugeMetrics {
						if n := len(labels(t, rm, name, c.key)); n > c.gauge {
							t.Fatalf("after %d tenants: %s has %d labels, bound %d", i+1, name, n, c.gauge)
						}
					}
				}
			}
			rm := e.collect(t)
			for _, name := range gaugeMetrics {
				if n := len(labels(t, rm, name, c.key)); n != c.gauge {
					t.Errorf("%s: %d labels, want %d: %v", name, n, c.gauge, labels(t, rm, name, c.key))
				}
			}
			// Every tenant is released, so use_time reaches the bound;
			// only some are rejected, so the others may stay below it.
			for _, name := range pushMetrics {
				n := len(labels(t, rm, name, c.key))
				if n > c.push || n < 2 || name == "tenantdb.tenant.connection.use_time" && n != c.push {
					t.Errorf("%s: %d labels, want %d (at most, for all but use_time, and more than other alone)",
						name, n, c.push)
				}
			}
			// Each label has one series per outcome at most.
			if n := len(points(t, rm, "tenantdb.tenant.connection.wait_time")); n > 2*c.push {
				t.Errorf("wait_time: %d series for %d labels and 2 outcomes", n, c.push)
			}
			// Nothing is lost to the bound: "other" gets the rest.
			var acquired float64
			for _, p := range points(t, rm, "tenantdb.tenant.connection.wait_time") {
				if v, _ := p.attrs.Value(tracing.OutcomeKey); v.AsString() == "acquired" {
					acquired += p.value
				}
			}
			if acquired != tenants {
				t.Errorf("wait_time counts %v acquisitions, want %d", acquired, tenants)
			}
			for _, p := range held {
				p.Release()
			}
		})
	}
}

// TestTopTenantsNamesTheBusiest checks that TopTenants labels the tenants
// with the most in use and waiting, and sums the others.
func TestTopTenantsNamesTheBusiest(t *testing.T) {
	e := newEnv(t, tracing.WithCardinality(tracing.TopTenants(2, 2)))
	g := newGate(t, e.tr, pool.Config{Capacity: 20, Plans: map[string]pool.Plan{"p": {MaxConns: 5}}})
	stop, err := e.tr.ObserveGate(g)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx := context.Background()
	var held []pool.Permit
	for tenant, n := range map[string]int{"big": 4, "mid": 3, "small1": 1, "small2": 1} {
		for range n {
			held = append(held, mustAcquire(t, ctx, g, tenant))
		}
	}
	rm := e.collect(t)
	count := func(tenant string) float64 {
		return value(t, rm, "tenantdb.tenant.connection.count", tracing.TenantKey.String(tenant)).value
	}
	if count("big") != 4 || count("mid") != 3 || count(tracing.OtherTenants) != 2 {
		t.Errorf("count: big %v, mid %v, other %v; want 4, 3, 2", count("big"), count("mid"), count(tracing.OtherTenants))
	}
	if got := value(t, rm, "tenantdb.tenant.connection.max", tracing.TenantKey.String("big")).value; got != 5 {
		t.Errorf("max{big} = %v, want 5", got)
	}
	if got := labels(t, rm, "tenantdb.tenant.connection.max", tracing.TenantKey); got[tracing.OtherTenants] {
		t.Errorf("max reported for other: %v", got)
	}
	// The busiest at the last collection get their own use_time series.
	for _, p := range held {
		p.Release()
	}
	rm = e.collect(t)
	if got := labels(t, rm, "tenantdb.tenant.connection.use_time", tracing.TenantKey); len(got) != 3 ||
		!got["big"] || !got["mid"] || !got[tracing.OtherTenants] {
		t.Errorf("use_time labels %v, want big, mid and other", got)
	}
}

// TestTopTenantsNamesABurstBetweenCollections: with the default TopTenants,
// a tenant that was idle at the last collection and is refused, or queues
// behind its own cap, before the next one is named in the counters and
// histograms of that burst, not summed as "other"; a quiet tenant that only
// got its connections is still "other".
func TestTopTenantsNamesABurstBetweenCollections(t *testing.T) {
	e := newEnv(t) // the default cardinality, TopTenants(10, 100)
	g := newGate(t, e.tr, pool.Config{Capacity: 10,
		Plans: map[string]pool.Plan{"p": {MaxConns: 1, MaxWaiting: 1, MaxWait: time.Minute}}})
	stop, err := e.tr.ObserveGate(g)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx := context.Background()
	e.collect(t) // a scrape while nothing is busy

	// The burst: noisy is refused 5 times; queued waits behind its own
	// holder; quiet only takes and returns a connection.
	noisy := mustAcquire(t, ctx, g, "noisy")
	for range 5 {
		if _, err := g.Acquire(ctx, "noisy"); !errors.Is(err, pool.ErrOverLimit) {
			t.Fatalf("noisy over its cap: %v", err)
		}
	}
	noisy.Release()
	first := mustAcquire(t, ctx, g, "queued")
	second := acquireAsync(ctx, g, "queued")
	tenantdbtest.Eventually(t, probeTimeout, "queued waits", tenantWaiting(g, "queued", 1))
	first.Release()
	if r := recv(t, second); r.err != nil {
		t.Fatal(r.err)
	} else {
		r.p.Release()
	}
	mustAcquire(t, ctx, g, "quiet").Release()

	rm := e.collect(t) // the next scrape: everyone is idle again
	rejections := func(tenant string) float64 {
		var n float64
		for _, p := range points(t, rm, "tenantdb.tenant.connection.rejections") {
			if v, _ := p.attrs.Value(tracing.TenantKey); v.AsString() == tenant {
				n += p.value
			}
		}
		return n
	}
	if rejections("noisy") != 5 || rejections(tracing.OtherTenants) != 0 {
		t.Errorf("rejections: noisy %v, other %v; want 5, 0", rejections("noisy"), rejections(tracing.OtherTenants))
	}
	waits := labels(t, rm, "tenantdb.tenant.connection.wait_time", tracing.TenantKey)
	if !waits["queued"] || !waits["noisy"] || waits["quiet"] {
		t.Errorf("wait_time labels %v: want noisy and queued named, quiet in other", waits)
	}
}
