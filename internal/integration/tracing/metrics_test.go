package tracing_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
)

// TestObserveGateReportsPoolAndTenantGauges checks the observable metrics
// against a Gate in a known state: two permits held, one request waiting.
func TestObserveGateReportsPoolAndTenantGauges(t *testing.T) {
	e := newEnv(t, tracing.WithCardinality(tracing.ByTenant(10)))
	g := newGate(t, e.tr, pool.Config{
		Capacity: 3,
		Plans:    map[string]pool.Plan{"std": {MaxConns: 2, MaxWaiting: 5}},
	})
	stop, err := e.tr.ObserveGate(g)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a1, a2 := mustAcquire(t, ctx, g, "a"), mustAcquire(t, ctx, g, "a")
	waiter := acquireAsync(ctx, g, "a")
	tenantdbtest.Eventually(t, probeTimeout, "a waits", tenantWaiting(g, "a", 1))

	rm := e.collect(t)
	poolAttr := semconv.DBClientConnectionPoolName("tenantdb")
	a := tracing.TenantKey.String("a")
	for _, c := range []struct {
		name string
		want float64
		attr []attribute.KeyValue
	}{
		{"db.client.connection.count", 2, nil},
		{"db.client.connection.max", 3, nil},
		{"db.client.connection.pending_requests", 1, nil},
		{"tenantdb.tenant.connection.count", 2, []attribute.KeyValue{a}},
		{"tenantdb.tenant.connection.pending_requests", 1, []attribute.KeyValue{a}},
		{"tenantdb.tenant.connection.max", 2, []attribute.KeyValue{a}},
		{"tenantdb.tenant.connection.effective_max", 2, []attribute.KeyValue{a}},
	} {
		kvs := append([]attribute.KeyValue{poolAttr}, c.attr...)
		if c.name == "db.client.connection.count" {
			kvs = append(kvs, semconv.DBClientConnectionStateUsed)
		}
		if got := value(t, rm, c.name, kvs...).value; got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	// "other" is reported, as zeros, so that its series is stable.
	other := tracing.TenantKey.String(tracing.OtherTenants)
	if got := value(t, rm, "tenantdb.tenant.connection.count", other).value; got != 0 {
		t.Errorf("count{other} = %v", got)
	}
	if m, _ := metricNamed(rm, "db.client.connection.count"); m.Unit != "{connection}" {
		t.Errorf("db.client.connection.count unit %q", m.Unit)
	}

	// A second pool under the same Tracer would mix their numbers.
	if _, err := e.tr.ObserveGate(g); !errors.Is(err, tracing.ErrObserving) {
		t.Errorf("second ObserveGate: %v, want ErrObserving", err)
	}
	a1.Release()
	recv(t, waiter).p.Release()
	a2.Release()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	rm = e.collect(t)
	if _, ok := metricNamed(rm, "db.client.connection.max"); ok {
		t.Error("observable metrics still reported after stop")
	}
	stop, err = e.tr.ObserveGate(g)
	if err != nil {
		t.Fatalf("ObserveGate after stop: %v", err)
	}
	_ = stop()
}

// TestAdaptiveEffectiveLimitInMetricAndSpan: with adaptive limits a cold
// tenant starts at the floor, below its cap; the gauge and the admission
// span both say so, next to the cap.
func TestAdaptiveEffectiveLimitInMetricAndSpan(t *testing.T) {
	e := newEnv(t, tracing.WithCardinality(tracing.ByTenant(10)))
	g := newGate(t, e.tr, pool.Config{
		Capacity: 8,
		Plans:    map[string]pool.Plan{"std": {MaxConns: 6}},
		Adaptive: pool.Adaptive{Enabled: true, MinConns: 2},
	})
	stop, err := e.tr.ObserveGate(g)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx, root := e.root(context.Background())
	p := mustAcquire(t, ctx, g, "a")
	defer p.Release()
	root.End()
	rm := e.collect(t)
	a := tracing.TenantKey.String("a")
	if got := value(t, rm, "tenantdb.tenant.connection.max", a).value; got != 6 {
		t.Errorf("max = %v, want the cap 6", got)
	}
	if got := value(t, rm, "tenantdb.tenant.connection.effective_max", a).value; got != 2 {
		t.Errorf("effective_max = %v, want the floor 2", got)
	}
	spans := e.ended("tenantdb.acquire")
	if len(spans) == 0 {
		t.Fatal("no admission span")
	}
	s := spans[len(spans)-1]
	if got := mustAttr(t, s, tracing.EffectiveLimitKey).AsInt64(); got != 2 {
		t.Errorf("span %s = %d, want 2", tracing.EffectiveLimitKey, got)
	}
	if got := mustAttr(t, s, tracing.LimitKey).AsInt64(); got != 6 {
		t.Errorf("span %s = %d, want 6", tracing.LimitKey, got)
	}
}
