package poolhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/pool/poolhttp"
)

// upstream is a real server on loopback that counts the calls reaching it.
func upstream(t *testing.T) (url string, calls *atomic.Int64) {
	calls = new(atomic.Int64)
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.WriteString(w, strings.Repeat("x", 64<<10)) // more than one read's worth
	}))
	return srv.URL, calls
}

func transportClient(t *testing.T, g *pool.Gate) *http.Client {
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	return &http.Client{Transport: &poolhttp.Transport{Gate: g, Base: base}}
}

func call(t *testing.T, c *http.Client, ctx context.Context, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	return c.Do(req)
}

// TestTransportHoldsSlotUntilBodyClosed: the slot is held after the
// response arrives, while the body is unread, until Close; a second call of
// the tenant meanwhile is over its limit and never sent; another tenant's
// call goes through.
func TestTransportHoldsSlotUntilBodyClosed(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"quota": {MaxConns: 1}}})
	url, calls := upstream(t)
	c := transportClient(t, g)
	acme := pool.WithTenant(context.Background(), "acme")

	resp, err := call(t, c, acme, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	if s := tenantStat(g, "acme"); s.InUse != 1 {
		t.Fatalf("in use %d with the body partly read, want 1", s.InUse)
	}
	_, err = call(t, c, acme, url)
	var ole *pool.OverLimitError
	if !errors.As(err, &ole) || !errors.Is(err, pool.ErrOverLimit) || ole.Tenant != "acme" {
		t.Fatalf("second call: %v; want an *OverLimitError for acme", err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream got %d calls, want 1: a refused call must not be sent", n)
	}
	other, err := call(t, c, pool.WithTenant(context.Background(), "globex"), url)
	if err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	other.Body.Close()
	resp.Body.Close()
	resp.Body.Close() // idempotent
	if s := tenantStat(g, "acme"); s.InUse != 0 {
		t.Fatalf("in use %d after Close, want 0", s.InUse)
	}
	if s := g.Stat(); s.InUse != 0 || s.Acquired != 2 {
		t.Fatalf("gate: in use %d, acquired %d; want 0, 2", s.InUse, s.Acquired)
	}
}

// TestTransportReleasesAtEOFAndWithoutBody: with a cap of 1, a body read to
// its end gives the slot back before Close (the tenant's next call goes
// through), and so does a 204 or a HEAD, whose body is empty; a Close after
// EOF releases nothing twice.
func TestTransportReleasesAtEOFAndWithoutBody(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"quota": {MaxConns: 1}}})
	url, _ := upstream(t)
	empty := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})).URL
	c := transportClient(t, g)
	acme := pool.WithTenant(context.Background(), "acme")

	read, err := call(t, c, acme, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, read.Body); err != nil {
		t.Fatal(err)
	}
	if s := tenantStat(g, "acme"); s.InUse != 0 {
		t.Fatalf("in use %d with the body read to EOF, want 0", s.InUse)
	}
	noContent, err := call(t, c, acme, empty)
	if err != nil {
		t.Fatalf("a call after EOF: %v", err)
	}
	if noContent.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d", noContent.StatusCode)
	}
	if s := tenantStat(g, "acme"); s.InUse != 0 {
		t.Fatalf("in use %d with a 204 unclosed, want 0", s.InUse)
	}
	req, _ := http.NewRequestWithContext(acme, http.MethodHead, url, nil)
	head, err := c.Do(req)
	if err != nil {
		t.Fatalf("a call after a 204: %v", err)
	}
	if s := tenantStat(g, "acme"); s.InUse != 0 {
		t.Fatalf("in use %d with a HEAD unclosed, want 0", s.InUse)
	}
	held, err := call(t, c, acme, url) // holds the slot: its body is unread
	if err != nil {
		t.Fatal(err)
	}
	read.Body.Close()
	noContent.Body.Close()
	head.Body.Close()
	if s := tenantStat(g, "acme"); s.InUse != 1 {
		t.Fatalf("in use %d: a Close after EOF released another call's slot", s.InUse)
	}
	held.Body.Close()
	if s := g.Stat(); s.InUse != 0 || s.Acquired != 4 {
		t.Fatalf("gate: in use %d, acquired %d; want 0, 4", s.InUse, s.Acquired)
	}
}

// TestTransportNoTenant: a request whose context carries no tenant fails
// with ErrNoTenant and is not sent.
func TestTransportNoTenant(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 2})
	url, calls := upstream(t)
	_, err := call(t, transportClient(t, g), context.Background(), url)
	if !errors.Is(err, poolhttp.ErrNoTenant) {
		t.Fatalf("no tenant: %v; want ErrNoTenant", err)
	}
	if calls.Load() != 0 || g.Stat().Acquired != 0 {
		t.Fatal("a call without a tenant was admitted or sent")
	}
}

// TestTransportReleasesOnError: a call that fails (the server is gone) and a
// call whose context ends while it waits for a slot hold nothing afterwards.
func TestTransportReleasesOnError(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"quota": {MaxConns: 1, MaxWaiting: 1}}})
	srv := newServer(t, http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c := transportClient(t, g)
	acme := pool.WithTenant(context.Background(), "acme")
	if _, err := call(t, c, acme, url); err == nil {
		t.Fatal("a call to a closed server succeeded")
	}
	if s := tenantStat(g, "acme"); s.InUse != 0 || s.Acquired != 1 {
		t.Fatalf("after a failed call: in use %d, acquired %d; want 0, 1", s.InUse, s.Acquired)
	}

	live, _ := upstream(t)
	held, err := call(t, c, acme, live)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(acme)
	errc := make(chan error, 1)
	go func() {
		_, err := call(t, c, ctx, live)
		errc <- err
	}()
	eventually(t, "the second call waits", waiting(g, "acme", 1))
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	held.Body.Close()
	if s := tenantStat(g, "acme"); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("in use %d, waiting %d; want 0, 0", s.InUse, s.Waiting)
	}
}

type panicking struct{}

func (panicking) RoundTrip(*http.Request) (*http.Response, error) { panic("base transport bug") }

// TestTransportReleasesOnBasePanic: a Base that panics does not keep the
// tenant's slot.
func TestTransportReleasesOnBasePanic(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 2})
	tr := &poolhttp.Transport{Gate: g, Base: panicking{}}
	req, _ := http.NewRequestWithContext(pool.WithTenant(context.Background(), "acme"), http.MethodGet, "http://127.0.0.1/", nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic was swallowed")
			}
		}()
		tr.RoundTrip(req)
	}()
	if s := g.Stat(); s.InUse != 0 || s.Acquired != 1 {
		t.Fatalf("in use %d, acquired %d; want 0, 1", s.InUse, s.Acquired)
	}
}
