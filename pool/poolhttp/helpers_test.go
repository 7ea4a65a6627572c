package poolhttp_test

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/internal/poll"
	"github.com/tenantdb/tenantdb/pool"
)

func newGate(t testing.TB, cfg pool.Config) *pool.Gate {
	t.Helper()
	g, err := pool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

// headerTenant reads the tenant from X-Tenant; a missing header is an error.
func headerTenant(r *http.Request) (string, error) {
	id, ok := r.Header["X-Tenant"]
	if !ok {
		return "", errNoHeader
	}
	return id[0], nil
}

type headerError struct{}

func (headerError) Error() string { return "no X-Tenant header" }

var errNoHeader error = headerError{}

// newServer starts a real HTTP server on loopback; its panics are not logged.
func newServer(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func newClient(t testing.TB) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// eventually polls cond, a probe of state, every millisecond until it
// holds, for at most ten seconds.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, time.Millisecond, what, cond)
}

func tenantStat(g *pool.Gate, id string) pool.TenantStat {
	s, _ := g.TenantStat(id)
	return s
}

func inUse(g *pool.Gate, id string, n int) func() bool {
	return func() bool { return tenantStat(g, id).InUse == n }
}

func waiting(g *pool.Gate, id string, n int) func() bool {
	return func() bool { return tenantStat(g, id).Waiting == n }
}
