package poolhttp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/pool/poolhttp"
)

type result struct {
	status     int
	retryAfter string
	body       string
	err        error
	elapsed    time.Duration
}

func get(ctx context.Context, c *http.Client, url, tenant string) result {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return result{err: err}
	}
	if tenant != "-" {
		req.Header.Set("X-Tenant", tenant)
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err, elapsed: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b), err: err, elapsed: time.Since(start)}
}

func getAsync(ctx context.Context, c *http.Client, url, tenant string) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- get(ctx, c, url, tenant) }()
	return ch
}

// blocking is a handler that reports each request's tenant (from the
// context Middleware set) and blocks until released or the client goes.
type blocking struct {
	release chan struct{}
	tenants chan string
	served  atomic.Int64
}

func newBlocking() *blocking {
	return &blocking{release: make(chan struct{}), tenants: make(chan string, 100)}
}

func (b *blocking) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, _ := pool.TenantFrom(r.Context())
	b.tenants <- id
	select {
	case <-b.release:
	case <-r.Context().Done():
		return
	}
	b.served.Add(1)
	io.WriteString(w, "ok "+id)
}

// TestMiddlewareRejectsOverLimitAt429 holds a tenant's only slot with one
// request: the next is answered 429 with a whole-second Retry-After without
// reaching the handler, another tenant is served meanwhile, and the slot
// comes back when the first handler returns.
func TestMiddlewareRejectsOverLimitAt429(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"free": {MaxConns: 1}}})
	h := newBlocking()
	srv := newServer(t, poolhttp.Middleware(g, headerTenant)(h))
	c := newClient(t)
	ctx := context.Background()

	first := getAsync(ctx, c, srv.URL, "acme")
	if got := <-h.tenants; got != "acme" {
		t.Fatalf("handler saw tenant %q in its context, want acme", got)
	}
	if s := tenantStat(g, "acme"); s.InUse != 1 {
		t.Fatalf("acme holds %d slots while its handler runs, want 1", s.InUse)
	}
	r := get(ctx, c, srv.URL, "acme")
	if r.err != nil || r.status != http.StatusTooManyRequests {
		t.Fatalf("over the limit: %d, %v; want 429", r.status, r.err)
	}
	if n, err := strconv.Atoi(r.retryAfter); err != nil || n < 1 {
		t.Fatalf("Retry-After %q, want whole seconds >= 1", r.retryAfter)
	}
	other := getAsync(ctx, c, srv.URL, "globex")
	if got := <-h.tenants; got != "globex" {
		t.Fatalf("handler saw %q, want globex", got)
	}
	close(h.release)
	for _, ch := range []<-chan result{first, other} {
		if r := <-ch; r.err != nil || r.status != http.StatusOK {
			t.Fatalf("admitted request: %d, %v", r.status, r.err)
		}
	}
	eventually(t, "acme's slot is released", inUse(g, "acme", 0))
	if r := get(ctx, c, srv.URL, "acme"); r.status != http.StatusOK || r.body != "ok acme" {
		t.Fatalf("after release: %d %q", r.status, r.body)
	}
	if s := tenantStat(g, "acme"); s.Rejected != 1 || s.Acquired != 2 {
		t.Fatalf("acme acquired %d, rejected %d; want 2, 1", s.Acquired, s.Rejected)
	}
	if n := h.served.Load(); n != 3 {
		t.Fatalf("handler served %d, want 3 (the rejected request must not reach it)", n)
	}
}

// TestMiddlewareQueuesInThePlansBoundedQueue: with MaxWaiting 1 the second
// request waits and is served when the first returns, the third is
// rejected at once.
func TestMiddlewareQueuesInThePlansBoundedQueue(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"std": {MaxConns: 1, MaxWaiting: 1}}})
	h := newBlocking()
	srv := newServer(t, poolhttp.Middleware(g, headerTenant)(h))
	c := newClient(t)
	ctx := context.Background()

	first := getAsync(ctx, c, srv.URL, "acme")
	<-h.tenants
	second := getAsync(ctx, c, srv.URL, "acme")
	eventually(t, "the second request waits", waiting(g, "acme", 1))
	if r := get(ctx, c, srv.URL, "acme"); r.status != http.StatusTooManyRequests || r.retryAfter == "" {
		t.Fatalf("past the queue: %d, Retry-After %q; want 429 with Retry-After", r.status, r.retryAfter)
	}
	select {
	case <-h.tenants:
		t.Fatal("a queued request reached the handler while the tenant's slot was held")
	default:
	}
	close(h.release)
	for _, ch := range []<-chan result{first, second} {
		if r := <-ch; r.status != http.StatusOK {
			t.Fatalf("queued request: %d, %v", r.status, r.err)
		}
	}
}

// TestMiddlewareRefusals: a tenant error is 401, an ID the Gate refuses is
// 401, a closed gate is 503; none reaches the handler or holds a slot.
func TestMiddlewareRefusals(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 2})
	var reached atomic.Int64
	srv := newServer(t, poolhttp.Middleware(g, headerTenant)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		reached.Add(1)
	})))
	c := newClient(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, tenant string
		want         int
	}{
		{"no header", "-", http.StatusUnauthorized},
		{"empty tenant", "", http.StatusUnauthorized},
		{"over-long tenant", strings.Repeat("a", 200), http.StatusUnauthorized},
	} {
		if r := get(ctx, c, srv.URL, tc.tenant); r.err != nil || r.status != tc.want {
			t.Fatalf("%s: %d, %v; want %d", tc.name, r.status, r.err, tc.want)
		}
	}
	g.Close()
	if r := get(ctx, c, srv.URL, "acme"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("closed gate: %d, want 503", r.status)
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d refused requests reached the handler", n)
	}
	if s := g.Stat(); s.InUse != 0 || s.Acquired != 0 {
		t.Fatalf("refused requests acquired %d, hold %d", s.Acquired, s.InUse)
	}
}

// TestMiddlewareReleasesOnPanic: a handler panic (plain, and
// http.ErrAbortHandler) releases the slot and still reaches net/http, which
// aborts the response; the tenant is served again afterwards.
func TestMiddlewareReleasesOnPanic(t *testing.T) {
	for _, v := range []any{"boom", http.ErrAbortHandler} {
		g := newGate(t, pool.Config{Capacity: 2, Plans: map[string]pool.Plan{"p": {MaxConns: 1}}})
		var recovered atomic.Value
		inner := poolhttp.Middleware(g, headerTenant)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/panic" {
				panic(v)
			}
			io.WriteString(w, "ok")
		}))
		// Observe the panic where net/http would: above the middleware.
		srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if p := recover(); p != nil {
					recovered.Store(p)
					if s := tenantStat(g, "acme"); s.InUse != 0 {
						t.Errorf("slot still held when the panic left the middleware: %d", s.InUse)
					}
					panic(p)
				}
			}()
			inner.ServeHTTP(w, r)
		}))
		c := newClient(t)
		if r := get(context.Background(), c, srv.URL+"/panic", "acme"); r.err == nil {
			t.Fatalf("panic %v: the client got a response (%d); net/http should abort it", v, r.status)
		}
		if recovered.Load() != v {
			t.Fatalf("the panic was not re-raised: got %v", recovered.Load())
		}
		eventually(t, "the slot is released", inUse(g, "acme", 0))
		if r := get(context.Background(), c, srv.URL, "acme"); r.status != http.StatusOK {
			t.Fatalf("after panic %v: %d, %v", v, r.status, r.err)
		}
	}
}

// TestMiddlewareReleasesWhenClientGoes: a client that goes while its
// request runs, and one that goes while it waits in the queue, leave no slot
// held and no request waiting.
func TestMiddlewareReleasesWhenClientGoes(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"std": {MaxConns: 1, MaxWaiting: 4}}})
	h := newBlocking()
	srv := newServer(t, poolhttp.Middleware(g, headerTenant)(h))
	c := newClient(t)

	runCtx, cancelRun := context.WithCancel(context.Background())
	running := getAsync(runCtx, c, srv.URL, "acme")
	<-h.tenants
	waitCtx, cancelWait := context.WithCancel(context.Background())
	queued := getAsync(waitCtx, c, srv.URL, "acme")
	eventually(t, "the second request waits", waiting(g, "acme", 1))

	cancelWait()
	if r := <-queued; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled queued request: %v", r.err)
	}
	eventually(t, "the gone client's request stops waiting", waiting(g, "acme", 0))
	if s := tenantStat(g, "acme"); s.InUse != 1 {
		t.Fatalf("in use %d while the first request runs, want 1", s.InUse)
	}
	cancelRun()
	if r := <-running; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled running request: %v", r.err)
	}
	eventually(t, "the gone client's slot is released", inUse(g, "acme", 0))
	if s := tenantStat(g, "acme"); s.Cancelled != 1 || s.Acquired != 1 {
		t.Fatalf("acquired %d, cancelled %d; want 1, 1", s.Acquired, s.Cancelled)
	}
	if n := h.served.Load(); n != 0 {
		t.Fatalf("handler served %d requests of gone clients", n)
	}
}

// TestMiddlewareRejectsFast measures the 429 path against the served path
// on the same server: rejecting must not cost more than serving a request
// whose handler does nothing (plus slack for a loaded machine).
func TestMiddlewareRejectsFast(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 2, Plans: map[string]pool.Plan{"p": {MaxConns: 1}}})
	h := newBlocking()
	mw := poolhttp.Middleware(g, headerTenant)
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fast" {
			io.WriteString(w, "ok")
			return
		}
		mw(h).ServeHTTP(w, r)
	}))
	c := newClient(t)
	ctx := context.Background()
	held := getAsync(ctx, c, srv.URL, "acme")
	<-h.tenants
	const n = 50
	var served, rejected time.Duration
	for range n {
		served += get(ctx, c, srv.URL+"/fast", "acme").elapsed
		r := get(ctx, c, srv.URL, "acme")
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("status %d, want 429", r.status)
		}
		rejected += r.elapsed
	}
	close(h.release)
	<-held
	if rejected > 3*served+50*time.Millisecond {
		t.Fatalf("50 rejections took %v, 50 trivial served requests %v: rejecting should cost about as much", rejected, served)
	}
}

// TestMiddlewareClassPerRoute: with ClassOf, an import route's requests are
// batch work, held to the batch cap and queued by the batch policy, while
// the tenant's other routes still get its remaining slots; the handler's
// context carries the class on. A route mapped to a class the Gate lacks
// gets 500 and holds nothing.
func TestMiddlewareClassPerRoute(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"std": {MaxConns: 2}},
		Classes: map[string]pool.Class{"batch": {MaxConns: 1, MaxWaiting: 5}}})
	h := newBlocking()
	classes := make(chan string, 8)
	mux := http.NewServeMux()
	mux.Handle("/import", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := pool.ClassFrom(r.Context())
		classes <- c
		h.ServeHTTP(w, r)
	}))
	mux.Handle("/", h)
	srv := newServer(t, poolhttp.Middleware(g, headerTenant, poolhttp.ClassOf(func(r *http.Request) string {
		switch r.URL.Path {
		case "/import":
			return "batch"
		case "/typo":
			return "bacth"
		}
		return ""
	}))(mux))
	c := newClient(t)
	ctx := context.Background()

	imp := getAsync(ctx, c, srv.URL+"/import", "acme")
	<-h.tenants
	if got := <-classes; got != "batch" {
		t.Fatalf("the import handler's class %q, want batch", got)
	}
	queued := getAsync(ctx, c, srv.URL+"/import", "acme")
	eventually(t, "a second import queues at the batch cap", waiting(g, "acme", 1))
	read := getAsync(ctx, c, srv.URL+"/", "acme") // not behind the import queue
	<-h.tenants
	if r := get(ctx, c, srv.URL+"/typo", "acme"); r.status != http.StatusInternalServerError {
		t.Fatalf("a route of an unknown class: %d, want 500", r.status)
	}
	close(h.release)
	for _, ch := range []<-chan result{imp, queued, read} {
		if r := <-ch; r.status != http.StatusOK {
			t.Fatalf("status %d, %v", r.status, r.err)
		}
	}
	if s := tenantStat(g, "acme"); len(s.Classes) != 2 || s.Classes[1].Acquired != 2 || s.Classes[0].Acquired != 1 {
		t.Fatalf("per-class admissions: %+v", s.Classes)
	}
	eventually(t, "nothing held", inUse(g, "acme", 0))
}

// TestMiddlewareCountsHijackedConnection: a handler that hijacks its
// connection and returns, leaving a session running on it, keeps the
// tenant's only slot until that connection is closed; the tenant's next
// request meanwhile gets 429.
func TestMiddlewareCountsHijackedConnection(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"free": {MaxConns: 1}}})
	returned := make(chan struct{}, 1)
	sessionDone := make(chan struct{})
	hijacking := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		go func() { // the session outlives the handler
			defer close(sessionDone)
			defer conn.Close()
			io.Copy(conn, brw)
		}()
	})
	mw := poolhttp.Middleware(g, headerTenant)(hijacking)
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mw.ServeHTTP(w, r)
		returned <- struct{}{}
	}))

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\nX-Tenant: acme\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	<-returned
	io.WriteString(conn, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("echo: %q, %v", line, err)
	}
	if s := tenantStat(g, "acme"); s.InUse != 1 {
		t.Fatalf("acme holds %d slots with its hijacked session open, want 1", s.InUse)
	}
	if r := get(context.Background(), newClient(t), srv.URL, "acme"); r.status != http.StatusTooManyRequests {
		t.Fatalf("a request during the session: %d, %v; want 429", r.status, r.err)
	}
	conn.Close()
	<-sessionDone
	eventually(t, "the closed session's slot is released", inUse(g, "acme", 0))
	if s := g.Stat(); s.InUse != 0 || s.Acquired != 1 {
		t.Fatalf("gate: in use %d, acquired %d; want 0, 1", s.InUse, s.Acquired)
	}
}

// TestMiddlewareHidesLookupErrors: whatever Lookup fails with, the client
// gets 401 or 503 with a fixed body, none of Lookup's own text.
func TestMiddlewareHidesLookupErrors(t *testing.T) {
	const secret = "10.9.8.7:5432 password=hunter2"
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"outage", errors.New("dial " + secret), http.StatusServiceUnavailable},
		{"unknown tenant", fmt.Errorf("%w: not in %s", pool.ErrInvalidTenant, secret), http.StatusUnauthorized},
		{"lookup timeout", fmt.Errorf("query %s: %w", secret, context.DeadlineExceeded), http.StatusServiceUnavailable},
	} {
		g := newGate(t, pool.Config{Capacity: 2, Lookup: func(context.Context, string) (pool.Tenant, error) {
			return pool.Tenant{}, tc.err
		}})
		srv := newServer(t, poolhttp.Middleware(g, headerTenant)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
		r := get(context.Background(), newClient(t), srv.URL, "acme")
		if r.status != tc.want || strings.Contains(r.body, "hunter2") || strings.Contains(r.body, "10.9.8.7") {
			t.Errorf("%s: %d %q; want %d without Lookup's text", tc.name, r.status, r.body, tc.want)
		}
	}
}

// TestMiddlewareSkip: a skipped route (a health check) is served without a
// tenant and takes no slot, even with the tenant's only slot held; other
// routes are admitted as before.
func TestMiddlewareSkip(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 1, Plans: map[string]pool.Plan{"p": {MaxConns: 1}}})
	h := newBlocking()
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	srv := newServer(t, poolhttp.Middleware(g, headerTenant, poolhttp.Skip(func(r *http.Request) bool {
		return r.URL.Path == "/healthz"
	}))(mux))
	c := newClient(t)
	first := getAsync(context.Background(), c, srv.URL, "acme")
	<-h.tenants
	if r := get(context.Background(), c, srv.URL+"/healthz", "-"); r.status != http.StatusOK || r.body != "ok" {
		t.Fatalf("skipped route without a tenant, slots all held: %d %q; want 200", r.status, r.body)
	}
	if r := get(context.Background(), c, srv.URL+"/other", "-"); r.status != http.StatusUnauthorized {
		t.Fatalf("a route not skipped without a tenant: %d, want 401", r.status)
	}
	close(h.release)
	<-first
	if s := g.Stat(); s.Acquired != 1 {
		t.Fatalf("acquired %d, want 1: the skipped route took a slot", s.Acquired)
	}
}
