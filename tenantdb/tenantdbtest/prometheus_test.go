package tenantdbtest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// TestPrometheusScrapesThisProcess serves a counter from this process's
// loopback and checks that Prometheus scrapes it and evaluates a loaded
// recording rule and alert over it; promtool in the container checks the
// rule file, and fails on a missing one.
func TestPrometheusScrapesThisProcess(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintln(w, "# TYPE tenantdbtest_answers_total counter")
		fmt.Fprintln(w, `tenantdbtest_answers_total{tenant="acme"} 42`)
	}))
	defer srv.Close()

	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yml")
	writeFile(t, rules, `groups:
  - name: tenantdbtest
    rules:
      - record: tenantdbtest:answers:doubled
        expr: 2 * tenantdbtest_answers_total
      - alert: TenantdbtestAnswered
        expr: tenantdbtest_answers_total > 0
        for: 1h
`)
	p := tenantdbtest.StartPrometheusWith(t, tenantdbtest.PrometheusConfig{
		Targets:   []string{strings.TrimPrefix(srv.URL, "http://")},
		RuleFiles: []string{rules},
	})
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "the scraped counter and its recording rule", func(ctx context.Context) error {
		s, err := p.Query(ctx, `tenantdbtest:answers:doubled{tenant="acme"}`)
		if err != nil {
			return err
		}
		if len(s) != 1 || s[0].Value != 84 {
			return fmt.Errorf("got %v, want one series of 84", s)
		}
		return nil
	})
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "the alert pending", func(ctx context.Context) error {
		alerts, err := p.Alerts(ctx)
		if err != nil {
			return err
		}
		if len(alerts) != 1 || alerts[0].State != "pending" || alerts[0].Labels["tenant"] != "acme" {
			return fmt.Errorf("alerts %+v, want TenantdbtestAnswered pending for acme", alerts)
		}
		return nil
	})
	if _, err := p.Query(t.Context(), "sum("); err == nil || !strings.Contains(err.Error(), "parse error") {
		t.Errorf("a PromQL syntax error: %v", err)
	}
	if out, err := p.Promtool(t.Context(), "check", "rules", tenantdbtest.RuleFilePath(rules)); err != nil || !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules: %q, %v", out, err)
	}
	if _, err := p.Promtool(t.Context(), "check", "rules", "/nonexistent.yml"); err == nil {
		t.Errorf("promtool check rules of a missing file: no error")
	}
	// Bad input is refused before any container starts.
	for _, cfg := range []tenantdbtest.PrometheusConfig{
		{Targets: []string{"no-port"}},
		{RuleFiles: []string{filepath.Join(dir, "missing.yml")}},
	} {
		if p, err := tenantdbtest.RunPrometheus(t.Context(), cfg); err == nil || !strings.HasPrefix(err.Error(), "tenantdbtest: ") {
			if p != nil {
				_ = p.Terminate(context.Background())
			}
			t.Errorf("RunPrometheus(%+v): %v", cfg, err)
		}
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
