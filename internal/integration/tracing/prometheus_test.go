package tracing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
	"github.com/tenantdb/tenantdb/tracing/otelsetup"
)

// promEnv is a tenantdb pool on real PostgreSQL whose Tracer's metrics are
// served for Prometheus by a PrometheusExporter on this process's loopback.
type promEnv struct {
	pe      *otelsetup.PrometheusExporter
	p       *tenantdb.Pool
	metrics *httptest.Server
}

const promPool = "orders"

func newPromEnv(t *testing.T) *promEnv {
	t.Helper()
	pe, err := otelsetup.NewPrometheusExporter(otelsetup.PrometheusConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pe.Shutdown(context.Background()) })
	tr := tracing.New(tracing.WithMeterProvider(pe.MeterProvider()), tracing.WithPoolName(promPool),
		tracing.WithCardinality(tracing.ByTenant(10)))
	pcfg, err := pgxpool.ParseConfig(postgres(t).DSN)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 6 // room for every tenant's cap: waits come from tenant caps only
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Tracer: tr,
		Plans: map[string]tenantdb.Plan{
			"free": {MaxConns: 1}, // the excess is rejected at once
			// queued's waits are about 0.2 s, 0.25 s on average beside a CPU
			// burner, and none may time out: MaxWait leaves a wide margin.
			"standard": {MaxConns: 2, MaxWaiting: 2, MaxWait: 10 * time.Second},
		},
		DefaultPlan: "standard",
		Lookup: func(_ context.Context, id string) (tenantdb.Tenant, error) {
			if id == "noisy" {
				return tenantdb.Tenant{Plan: "free"}, nil
			}
			return tenantdb.Tenant{Plan: "standard"}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	stop, err := tr.ObservePool(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	mux := http.NewServeMux()
	mux.Handle("/metrics", pe.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &promEnv{pe: pe, p: p, metrics: srv}
}

// workload runs until ctx ends: "noisy" (plan free, cap 1) keeps its one
// connection busy with sleeps while asking for more, which is refused;
// "queued" (plan standard, cap 2 and a queue) runs four sleeps at a time, so
// that half of them wait; "quiet" runs quick queries, and every fifth time
// one that fails, one at a time: it never holds more than one connection.
func (e *promEnv) workload(ctx context.Context) (wait func()) {
	noisy := tenantdb.WithTenant(ctx, "noisy")
	quiet := tenantdb.WithTenant(ctx, "quiet")
	queued := tenantdb.WithTenant(ctx, "queued")
	var wg sync.WaitGroup
	loop := func(every time.Duration, f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				f()
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	loop(time.Millisecond, func() { _, _ = e.p.Exec(noisy, "select pg_sleep(0.3)") })
	loop(20*time.Millisecond, func() { _, _ = e.p.Exec(noisy, "select 1") })
	// quiet's queries share one goroutine. Two loops (the quick one and the
	// failing one) overlapped now and then, and a scrape that caught both
	// saw quiet at its cap of 2: its peak share 1, TenantdbTenantPinnedAtCap
	// pending on it, and the test failed on a loaded machine.
	var quietRuns int
	loop(20*time.Millisecond, func() {
		_, _ = e.p.Exec(quiet, "select 1")
		if quietRuns++; quietRuns%5 == 0 {
			_, _ = e.p.Exec(quiet, "select * from no_such_table_here")
		}
	})
	for range 4 { // twice its cap: half of them wait in its queue
		loop(time.Millisecond, func() { _, _ = e.p.Exec(queued, "select pg_sleep(0.2)") })
	}
	return wg.Wait
}

// Shipped files (tracing/prometheus), relative to this package.
const (
	shippedRules     = "../../../tracing/prometheus/tenantdb.rules.yml"
	shippedDashboard = "../../../tracing/prometheus/tenantdb.dashboard.json"
)

// dashboardExprs returns the PromQL of every panel target of the shipped
// dashboard, with its variables given values: $pool the test's pool,
// $__rate_interval one minute.
func dashboardExprs(t *testing.T, pool string) []string {
	t.Helper()
	b, err := os.ReadFile(shippedDashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", shippedDashboard, err)
	}
	var out []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", shippedDashboard, p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, strings.NewReplacer("$pool", pool, "$__rate_interval", "1m").Replace(tg.Expr))
		}
	}
	return out
}

// TestPrometheusShippedRulesAndDashboard is the end-to-end test of the
// metrics path: a tenantdb pool on real PostgreSQL under a noisy and a quiet
// tenant, its metrics served by NewPrometheusExporter, scraped by a real
// Prometheus that loads the shipped rules. promtool must accept the rules;
// every rule must evaluate without error and every recording rule and
// dashboard query return per-tenant data; and the numbers must tell the
// story: the noisy tenant refused and pinned at its cap, the queued one
// waiting in its queue (p99 wait over the alert's threshold), the quiet one
// never refused, waiting next to nothing, and not alerted on.
func TestPrometheusShippedRulesAndDashboard(t *testing.T) {
	e := newPromEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	wait := e.workload(ctx)
	t.Cleanup(func() { cancel(); wait() })

	prom := tenantdbtest.StartPrometheusWith(t, tenantdbtest.PrometheusConfig{
		Targets:   []string{strings.TrimPrefix(e.metrics.URL, "http://")},
		RuleFiles: []string{shippedRules},
	})
	if out, err := prom.Promtool(ctx, "check", "rules", tenantdbtest.RuleFilePath(shippedRules)); err != nil || !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}

	rulesText, err := os.ReadFile(shippedRules)
	if err != nil {
		t.Fatal(err)
	}
	wantRules := strings.Count(string(rulesText), "- record:") + strings.Count(string(rulesText), "- alert:")
	q := func(ctx context.Context, expr string) ([]tenantdbtest.Sample, error) { return prom.Query(ctx, expr) }

	// Wait until every rule has been evaluated cleanly over data with a
	// rate in it: two scrapes of the noisy tenant's growing rejections.
	var rules []tenantdbtest.RuleHealth
	tenantdbtest.EventuallyNoError(t, 90*time.Second, "rules evaluated over the noisy tenant's rejections", func(ctx context.Context) error {
		var err error
		if rules, err = prom.Rules(ctx); err != nil {
			return err
		}
		if len(rules) != wantRules {
			return fmt.Errorf("%d rules loaded, the file has %d", len(rules), wantRules)
		}
		for _, r := range rules {
			if r.Health != "ok" {
				return fmt.Errorf("rule %s: health %q %s", r.Name, r.Health, r.LastError)
			}
		}
		s, err := q(ctx, `tenantdb:tenant_rejections:rate5m{tenantdb_tenant_id="noisy",tenantdb_outcome="rejected"} > 0`)
		if err == nil && len(s) != 1 {
			err = fmt.Errorf("noisy's rejection rate: %v", s)
		}
		return err
	})

	// Every recording rule has data now; every alert expression and every
	// dashboard query is valid PromQL over the real names. Only the leak
	// and timeout queries have nothing to show in this scenario.
	for _, r := range rules {
		s, err := q(ctx, r.Query)
		if err != nil {
			t.Errorf("rule %s: %v", r.Name, err)
			continue
		}
		if strings.Contains(r.Name, ":") && len(s) == 0 {
			t.Errorf("recording rule %s returned no series", r.Name)
		}
	}
	exprs := dashboardExprs(t, promPool)
	if len(exprs) < 10 {
		t.Fatalf("dashboard: %d queries", len(exprs))
	}
	for _, expr := range exprs {
		s, err := q(ctx, expr)
		if err != nil {
			t.Errorf("dashboard: %v", err)
			continue
		}
		if len(s) == 0 && !strings.Contains(expr, "leaks") && !strings.Contains(expr, "timeouts") {
			t.Errorf("dashboard query returned no series: %s", expr)
		}
	}

	// The story in numbers.
	one := func(expr string) float64 {
		t.Helper()
		s, err := q(ctx, expr)
		if err != nil || len(s) != 1 {
			t.Fatalf("%s: %v, %v; want one series", expr, s, err)
		}
		return s[0].Value
	}
	none := func(expr string) {
		t.Helper()
		if s, err := q(ctx, expr); err != nil || len(s) != 0 {
			t.Errorf("%s: %v, %v; want no series", expr, s, err)
		}
	}
	none(`tenantdb:tenant_rejections:rate5m{tenantdb_tenant_id="quiet"}`)
	if v := one(`max_over_time(tenantdb:tenant_saturation:ratio{tenantdb_tenant_id="noisy"}[5m])`); v != 1 {
		t.Errorf("noisy's peak share of its cap: %v, want 1", v)
	}
	if v := one(`max_over_time(tenantdb:tenant_saturation:ratio{tenantdb_tenant_id="quiet"}[5m])`); v > 0.5 {
		t.Errorf("quiet's peak share of its cap: %v, want <= 0.5 (one query at a time, cap 2)", v)
	}
	quietWait := one(`tenantdb:tenant_wait_seconds:p99_5m{tenantdb_tenant_id="quiet"}`)
	queuedWait := one(`tenantdb:tenant_wait_seconds:p99_5m{tenantdb_tenant_id="queued"}`)
	t.Logf("p99 admission wait from Prometheus: quiet %.4f s, queued %.4f s", quietWait, queuedWait)
	if quietWait > 0.1 || queuedWait < 0.1 || queuedWait < 10*quietWait {
		t.Errorf("p99 admission wait: quiet %v s, queued %v s; want quiet under the TenantdbAdmissionSlow "+
			"threshold of 0.1 s, queued over it, and at least 10 times quiet's", quietWait, queuedWait)
	}
	none(`tenantdb:tenant_rejections:rate5m{tenantdb_tenant_id="queued"}`) // its queue absorbs the excess
	if v := one(`tenantdb:tenant_rejection_ratio:rate5m{tenantdb_tenant_id="noisy"}`); v <= 0 || v > 1 {
		t.Errorf("noisy's share of requests refused: %v", v)
	}
	if v := one(`db:client_operation_errors:rate5m{db_operation_name="SELECT",error_type="42P01"}`); v <= 0 {
		t.Errorf("failed SELECTs/s: %v", v)
	}
	if v := one(`db:client_operation_duration_seconds:p99_5m{db_operation_name="SELECT"}`); v < 0.1 {
		t.Errorf("p99 SELECT duration %v s, but about a fifth of the SELECTs sleep 0.2 or 0.3 s", v)
	}

	// The alert group is evaluated after the recording rules it reads: its
	// first evaluation may precede their first data.
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "TenantdbTenantRejected for noisy and TenantdbAdmissionSlow for queued, pending or firing", func(ctx context.Context) error {
		alerts, err := prom.Alerts(ctx)
		if err != nil {
			return err
		}
		var noisyRejected, queuedSlow bool
		for _, a := range alerts {
			switch a.Labels["tenantdb_tenant_id"] + " " + a.Labels["alertname"] {
			case "noisy TenantdbTenantRejected":
				noisyRejected = true
			case "queued TenantdbAdmissionSlow":
				queuedSlow = true
			case "quiet TenantdbTenantRejected", "quiet TenantdbAdmissionSlow", "quiet TenantdbTenantPinnedAtCap":
				t.Fatalf("alert on the quiet tenant: %+v", a)
			}
		}
		if !noisyRejected || !queuedSlow {
			return fmt.Errorf("alerts: %+v", alerts)
		}
		return nil
	})
}
