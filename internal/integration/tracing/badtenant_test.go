package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
	"github.com/tenantdb/tenantdb/tracing/otelsetup"
)

// scrape fetches the Prometheus exporter's page as Prometheus would,
// failing the test unless it answers 200.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s\n%s", resp.Status, body)
	}
	return string(body)
}

// TestBadTenantIDsInEndedRequestsReachNoLabel sends requests whose context
// had ended before they came, with an unknown tenant, an ID that is not
// UTF-8 and one with a control character, under ByTenant(3) and a
// Prometheus exporter (issue 33 item 1). None may take a label, count as a
// tenant's rejection or a connection timeout, or carry its ID on a span;
// the scrape keeps answering 200 and the real tenant gets its own label.
func TestBadTenantIDsInEndedRequestsReachNoLabel(t *testing.T) {
	pe, err := otelsetup.NewPrometheusExporter(otelsetup.PrometheusConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pe.Shutdown(context.Background()) })
	srv := httptest.NewServer(pe.Handler())
	t.Cleanup(srv.Close)
	e := newEnv(t)
	tr := tracing.New(tracing.WithTracerProvider(e.tp), tracing.WithMeterProvider(pe.MeterProvider()),
		tracing.WithCardinality(tracing.ByTenant(3)))
	known := map[string]bool{"acme": true}
	g := newGate(t, tr, pool.Config{Capacity: 2, Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
		if !known[id] {
			return pool.Tenant{}, errors.New("no such tenant")
		}
		return pool.Tenant{}, nil
	}})

	root, span := e.root(context.Background())
	cancelled, cancel := context.WithCancel(root)
	cancel()
	expired, cancel2 := context.WithDeadline(root, time.Now().Add(-time.Second))
	defer cancel2()
	bad := []struct {
		ctx     context.Context
		id      string
		invalid bool
	}{
		{cancelled, "bogus-1", false},
		{expired, "bogus-2", false},
		{cancelled, "bad-\xff\xfe", true},
		{expired, "ctl-\x01", true},
	}
	for _, b := range bad {
		_, err := g.Acquire(b.ctx, b.id)
		if err == nil {
			t.Fatalf("Acquire(%q) with an ended context succeeded", b.id)
		}
		if b.invalid && !errors.Is(err, pool.ErrInvalidTenant) {
			t.Errorf("Acquire(%q): %v, want ErrInvalidTenant", b.id, err)
		}
		if !b.invalid && errors.Is(err, pool.ErrInvalidTenant) {
			t.Errorf("Acquire(%q): %v, a valid ID called invalid", b.id, err)
		}
	}
	mustAcquire(t, root, g, "acme").Release()
	span.End()

	page := scrape(t, srv.URL)
	if !strings.Contains(page, `tenantdb_tenant_id="acme"`) {
		t.Errorf("the real tenant has no label of its own:\n%s", page)
	}
	for _, b := range bad {
		if strings.Contains(page, b.id) || strings.Contains(page, strings.ToValidUTF8(b.id, "")) {
			t.Errorf("%q reached a label:\n%s", b.id, page)
		}
	}
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "db_client_connection_timeouts_total") && !strings.HasSuffix(line, " 0") {
			t.Errorf("an ended request of an unknown tenant counts as a connection timeout: %s", line)
		}
		if strings.HasPrefix(line, "tenantdb_tenant_connection_rejections_total") {
			t.Errorf("an ended request of an unknown tenant counts as a tenant rejection: %s", line)
		}
	}
	for _, s := range e.ended(tracing.AcquireSpanName) {
		v, ok := attr(s, tracing.TenantKey)
		if !ok {
			continue
		}
		if id := v.AsString(); !utf8.ValidString(id) || strings.ContainsAny(id, "\x01") {
			t.Errorf("an invalid tenant ID %q is on a span", id)
		}
	}
	// The exporter keeps working after them: a real Prometheus scrapes it
	// (up is 1; a 500 would make it 0) and sees the real tenant's series,
	// labelled with its own ID, and no other tenant's.
	mustAcquire(t, root, g, "acme").Release()
	prom := tenantdbtest.StartPrometheusWith(t, tenantdbtest.PrometheusConfig{
		Targets: []string{strings.TrimPrefix(srv.URL, "http://")},
	})
	tenantdbtest.EventuallyNoError(t, time.Minute, "Prometheus scrapes the exporter", func(ctx context.Context) error {
		up, err := prom.Query(ctx, `up{job="tenantdbtest"}`)
		if err != nil {
			return err
		}
		if len(up) != 1 || up[0].Value != 1 {
			return fmt.Errorf("up = %v, want one target up", up)
		}
		series, err := prom.Query(ctx, `count by (tenantdb_tenant_id) (tenantdb_tenant_connection_use_time_seconds_count)`)
		if err != nil {
			return err
		}
		if len(series) != 1 || series[0].Labels["tenantdb_tenant_id"] != "acme" {
			return fmt.Errorf("tenant labels %v, want acme's alone", series)
		}
		return nil
	})
}

// TestLongTenantIDCutOnACharacterBoundary puts a 257-byte tenant ID whose
// last character takes two bytes on an admission span (a Gate allowing IDs
// that long): the attribute is cut at 256 bytes or fewer and stays valid
// UTF-8 (issue 33's maxTenantAttrLen suspicion).
func TestLongTenantIDCutOnACharacterBoundary(t *testing.T) {
	e := newEnv(t)
	g := newGate(t, e.tr, pool.Config{Capacity: 1, MaxTenantIDLen: 300})
	id := strings.Repeat("a", 255) + "é"
	ctx, root := e.root(context.Background())
	mustAcquire(t, ctx, g, id).Release()
	root.End()
	spans := e.ended(tracing.AcquireSpanName)
	if len(spans) != 1 {
		t.Fatalf("%d admission spans", len(spans))
	}
	got := mustAttr(t, spans[0], tracing.TenantKey).AsString()
	if !utf8.ValidString(got) || len(got) > 256 || !strings.HasPrefix(id, got) {
		t.Fatalf("a long tenant ID became %q (%d bytes, valid UTF-8 %v), want a prefix of it, valid, at most 256 bytes",
			got, len(got), utf8.ValidString(got))
	}
}

// slowCluster is a cluster limiter that takes hold to grant a slot, or
// waits for the request's context when hold is 0.
type slowCluster struct{ hold time.Duration }

func (c slowCluster) AcquireSlot(ctx context.Context, _ string, _ int, _ time.Duration) (pool.ClusterLease, error) {
	if c.hold == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	select {
	case <-time.After(c.hold):
		return localLease{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestWaitHistogramsIncludeTheClusterWait checks that the wait histograms
// hold the whole wait the admission span reports, cluster stage included,
// for a request granted after a slow cluster slot and for one that timed
// out asking for it (issue 33 item 2).
func TestWaitHistogramsIncludeTheClusterWait(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cluster slowCluster
		timeout time.Duration
		outcome string
	}{
		{"acquired", slowCluster{hold: 50 * time.Millisecond}, probeTimeout, "acquired"},
		{"timed out", slowCluster{}, 50 * time.Millisecond, "timed_out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tracing.WithCardinality(tracing.ByTenant(10)))
			g := newGate(t, e.tr, pool.Config{Capacity: 2, Cluster: tc.cluster})
			ctx, root := e.root(context.Background())
			ctx, cancel := context.WithTimeout(ctx, tc.timeout)
			defer cancel()
			p, err := g.Acquire(ctx, "acme")
			if err == nil {
				p.Release()
			}
			root.End()
			spans := e.ended(tracing.AcquireSpanName)
			if len(spans) != 1 {
				t.Fatalf("%d admission spans", len(spans))
			}
			s := spans[0]
			if got := mustAttr(t, s, tracing.OutcomeKey).AsString(); got != tc.outcome {
				t.Fatalf("outcome %s, want %s (err %v)", got, tc.outcome, err)
			}
			cluster := mustAttr(t, s, tracing.ClusterWaitKey).AsFloat64()
			whole := cluster + mustAttr(t, s, tracing.TenantWaitKey).AsFloat64() + mustAttr(t, s, tracing.GlobalWaitKey).AsFloat64()
			if cluster <= 0 {
				t.Fatalf("the span shows no cluster wait: %v", s.Attributes())
			}
			rm := e.collect(t)
			hist := value(t, rm, "tenantdb.tenant.connection.wait_time", tracing.TenantKey.String("acme"),
				tracing.OutcomeKey.String(tc.outcome))
			if hist.sum < cluster || !near(hist.sum, whole) {
				t.Errorf("tenant wait histogram sum %.6f s; the span's waits add up to %.6f s, %.6f s of it in the cluster",
					hist.sum, whole, cluster)
			}
			if tc.outcome == "acquired" {
				pool := value(t, rm, "db.client.connection.wait_time")
				if pool.sum < cluster || !near(pool.sum, whole) {
					t.Errorf("pool wait histogram sum %.6f s; the span's waits add up to %.6f s, %.6f s of it in the cluster",
						pool.sum, whole, cluster)
				}
			}
		})
	}
}

// near reports whether two sums of the same durations agree up to float
// rounding.
func near(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }
