package tracing_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/pool/poolhttp"
	"github.com/tenantdb/tenantdb/tracing"
)

// TestHTTPGateAdmissionsRecorded: a Tracer set as Config.Tracer of a
// poolhttp gate records its requests' admissions like tenantdb's: a span
// per admission and per-tenant metrics under the gate's pool name, with the
// Tracer's cardinality bound holding for tenant IDs that come from requests.
func TestHTTPGateAdmissionsRecorded(t *testing.T) {
	e := newEnv(t, tracing.WithPoolName("http"), tracing.WithRootSpans(), tracing.WithCardinality(tracing.ByTenant(2)))
	g := newGate(t, e.tr, pool.Config{Capacity: 8, Plans: map[string]pool.Plan{"api": {MaxConns: 1}}})
	release, entered := make(chan struct{}), make(chan struct{}, 8)
	h := poolhttp.Middleware(g, func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil })(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			if r.Header.Get("X-Hold") != "" {
				<-release
			}
		}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	get := func(tenant string, hold bool) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-Tenant", tenant)
		if hold {
			req.Header.Set("X-Hold", "1")
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	held := make(chan int, 1)
	go func() { held <- get("a", true) }()
	<-entered
	if code := get("a", false); code != http.StatusTooManyRequests {
		t.Fatalf("over the limit: %d", code)
	}
	for _, tenant := range []string{"b", "c", "d", "e"} { // past ByTenant(2): "other"
		if code := get(tenant, false); code != http.StatusOK {
			t.Fatalf("tenant %s: %d", tenant, code)
		}
	}
	close(release)
	if code := <-held; code != http.StatusOK {
		t.Fatalf("held request: %d", code)
	}

	spans := e.ended(tracing.AcquireSpanName)
	outcomes := map[string]int{}
	for _, s := range spans {
		outcomes[mustAttr(t, s, tracing.OutcomeKey).AsString()]++
		if got := mustAttr(t, s, semconv.DBClientConnectionPoolNameKey).AsString(); got != "http" {
			t.Fatalf("span's pool name %q, want http", got)
		}
	}
	if outcomes["acquired"] != 5 || outcomes["rejected"] != 1 {
		t.Fatalf("admission spans by outcome %v, want 5 acquired and 1 rejected", outcomes)
	}

	rm := e.collect(t)
	httpPool := semconv.DBClientConnectionPoolName("http")
	if got := value(t, rm, "tenantdb.tenant.connection.rejections", httpPool, tracing.TenantKey.String("a")).value; got != 1 {
		t.Fatalf("tenant a's rejections %v, want 1", got)
	}
	tenants := map[string]bool{}
	for _, p := range points(t, rm, "tenantdb.tenant.connection.wait_time") {
		if v, ok := p.attrs.Value(semconv.DBClientConnectionPoolNameKey); !ok || v.AsString() != "http" {
			t.Fatalf("a wait_time series without the gate's pool name: %v", p.attrs)
		}
		v, _ := p.attrs.Value(tracing.TenantKey)
		tenants[v.AsString()] = true
	}
	want := map[string]bool{"a": true, "b": true, tracing.OtherTenants: true}
	if len(tenants) != len(want) {
		t.Fatalf("tenant labels %v, want %v: the cardinality bound must hold", tenants, want)
	}
	for k := range want {
		if !tenants[k] {
			t.Fatalf("tenant labels %v lack %q", tenants, k)
		}
	}
	if got := value(t, rm, "tenantdb.tenant.connection.use_time", httpPool, tracing.TenantKey.String(tracing.OtherTenants)).value; got != 3 {
		t.Fatalf("use_time count for %q %v, want 3 (c, d, e)", tracing.OtherTenants, got)
	}
}
