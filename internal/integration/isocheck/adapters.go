package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/pool/poolhttp"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// via is how one phase of an op (the hostile statement or write, or the
// probe) is carried to its path: called directly, inside a handler behind
// poolhttp.Middleware that an httptest server runs, or as a job of a
// pool.Runner. The middleware and the Runner have Gates of their own, as
// their docs ask, in front of the Pool's.
type via int

const (
	viaDirect via = iota
	viaHTTP
	viaJob
)

var viaNames = [...]string{"", "HTTP middleware", "Runner job"}

// phase runs one phase with ctx and returns what it saw wrong, its errors
// judged against ctx while ctx is still the one it ran with.
type phase func(ctx context.Context) []string

// adapters are the HTTP server and the Runner of one run, with their Gates.
type adapters struct {
	httpGate, jobGate *pool.Gate
	srv               *httptest.Server
	runner            *pool.Runner
	calls             sync.Map // call ID -> *httpCall
	nextCall          atomic.Int64
	accepted, ran     atomic.Int64 // jobs Submit accepted, jobs that ran
	onErrors          atomic.Int64
	mu                sync.Mutex
	firstOnError      string // guarded by mu
}

// httpCall is one request's phase, found by the handlers through its ID.
type httpCall struct {
	tenant string
	f      phase
	done   chan struct{} // closed when the server is done with the request

	mu        sync.Mutex
	arrived   bool // guarded by mu: the server took the request
	abandoned bool // guarded by mu: the client gave up before that; the server ignores it

	// Written before done is closed:
	ran    bool
	status int
	ctxErr error // the request's context's error when the middleware returned
	bad    []string
}

// statusWriter remembers the status the middleware or the handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
	w.ResponseWriter.WriteHeader(s)
}

// startAdapters starts the HTTP server and the Runner of a run of c with
// maxConns connections.
func (rc *runCtx) startAdapters(c config, maxConns int) error {
	gateCfg := func() pool.Config {
		cfg := pool.Config{
			Capacity:    maxConns + 1,
			Plans:       map[string]pool.Plan{"default": {MaxConns: 2, MaxWaiting: 1, MaxWait: 500 * time.Millisecond}},
			DefaultPlan: "default",
		}
		if c.classes {
			cfg.Classes = map[string]pool.Class{
				"batch":  {MaxConns: 1, MaxWaiting: tenantdb.Unbounded},
				"report": {MaxConns: 1, MaxWaiting: tenantdb.Unbounded, MaxShare: 0.5},
			}
		}
		return cfg
	}
	a := &adapters{}
	var err error
	if a.httpGate, err = pool.New(gateCfg()); err != nil {
		return err
	}
	if a.jobGate, err = pool.New(gateCfg()); err != nil {
		a.httpGate.Close()
		return err
	}
	a.runner, err = pool.NewRunner(pool.RunnerConfig{Gate: a.jobGate, MaxQueued: 4, OnError: func(t string, err error) {
		a.onErrors.Add(1)
		a.mu.Lock()
		if a.firstOnError == "" {
			a.firstOnError = fmt.Sprintf("tenant %s: %v", t, err)
		}
		a.mu.Unlock()
	}})
	if err != nil {
		a.httpGate.Close()
		a.jobGate.Close()
		return err
	}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := a.call(r)
		c.ran = true
		if got, _ := tenantdb.TenantFrom(r.Context()); got != c.tenant {
			c.bad = append(c.bad, fmt.Sprintf("the middleware's handler ran for tenant %q, not %q", got, c.tenant))
		}
		c.bad = append(c.bad, c.f(r.Context())...)
	})
	mw := poolhttp.Middleware(a.httpGate, func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil },
		poolhttp.ClassOf(func(r *http.Request) string { return r.Header.Get("X-Class") }))(inner)
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := a.call(r)
		if c == nil {
			http.Error(w, "no such call", http.StatusNotFound)
			return
		}
		c.mu.Lock()
		if c.abandoned {
			c.mu.Unlock()
			return
		}
		c.arrived = true
		c.mu.Unlock()
		defer close(c.done)
		sw := &statusWriter{ResponseWriter: w}
		mw.ServeHTTP(sw, r)
		c.status, c.ctxErr = sw.status, r.Context().Err()
	}))
	rc.adapters = a
	return nil
}

func (a *adapters) call(r *http.Request) *httpCall {
	v, _ := a.calls.Load(r.Header.Get("X-Call"))
	c, _ := v.(*httpCall)
	return c
}

// run carries f to its path by v, with ctx (the op's tenant, class,
// deadline or cancellation), and returns what f and the adapter saw wrong.
func (rc *runCtx) run(ctx context.Context, o op, v via, f phase) []string {
	inner := f
	f = func(ctx context.Context) []string { return inner(context.WithValue(ctx, callStartKey{}, time.Now())) }
	switch v {
	case viaHTTP:
		return rc.viaHTTP(ctx, o, f)
	case viaJob:
		return rc.viaJob(ctx, o, f)
	}
	return f(ctx)
}

// viaHTTP sends a request with ctx to the server, whose handler runs f
// behind the middleware with the request's context: a deadline or a
// cancellation of ctx reaches it as the client going away. A request the
// middleware did not admit must have got a documented answer.
func (rc *runCtx) viaHTTP(ctx context.Context, o op, f phase) []string {
	a := rc.adapters
	tenant := rc.env.tenants[o.tenant]
	id := strconv.FormatInt(a.nextCall.Add(1), 10)
	c := &httpCall{tenant: tenant, f: f, done: make(chan struct{})}
	a.calls.Store(id, c)
	defer a.calls.Delete(id)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.srv.URL, nil)
	if err != nil {
		return []string{err.Error()}
	}
	req.Header.Set("X-Call", id)
	req.Header.Set("X-Tenant", tenant)
	if o.class > 0 {
		req.Header.Set("X-Class", classNames[o.class])
	}
	resp, err := a.srv.Client().Do(req)
	retryAfter := ""
	if err == nil {
		retryAfter = resp.Header.Get("Retry-After")
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	c.mu.Lock()
	if !c.arrived {
		c.abandoned = true
		c.mu.Unlock()
		if err == nil {
			return []string{"HTTP: a response to a request the server never took"}
		}
		if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
			return nil
		}
		return []string{fmt.Sprintf("HTTP: the client failed: %v", err)}
	}
	c.mu.Unlock()
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		return []string{"HTTP: the server was still on the request a minute after the client was done"}
	}
	if c.ran {
		return c.bad
	}
	switch {
	case c.status == http.StatusTooManyRequests && retryAfter != "":
		return nil // over the tenant's cap, documented
	case c.status == http.StatusTooManyRequests:
		return []string{"HTTP: 429 without Retry-After"}
	case c.status == poolhttp.StatusClientClosedRequest && errors.Is(c.ctxErr, context.Canceled):
		return nil // the client went away while the request waited for a slot
	}
	return []string{fmt.Sprintf("HTTP: the middleware answered %d (request context: %v)", c.status, c.ctxErr)}
}

// viaJob submits f as a job of the tenant and waits until it ran. Submit's
// context governs only the submission; the job's deadline or cancellation
// is ctx's, reaching it wherever the job is by then.
func (rc *runCtx) viaJob(ctx context.Context, o op, f phase) []string {
	a := rc.adapters
	tenant := rc.env.tenants[o.tenant]
	done := make(chan struct{})
	var bad []string
	err := a.runner.Submit(ctx, tenant, func(jc context.Context) {
		defer close(done)
		a.ran.Add(1)
		if got, _ := pool.TenantFrom(jc); got != tenant {
			bad = append(bad, fmt.Sprintf("the job ran for tenant %q, not %q", got, tenant))
		}
		jctx, cancel := context.WithCancel(jc)
		defer cancel()
		stop := context.AfterFunc(ctx, cancel)
		defer stop()
		if ctx.Err() != nil {
			cancel()
		}
		bad = append(bad, f(jctx)...)
	})
	if err != nil {
		cerr := ctx.Err()
		if errors.Is(err, pool.ErrOverLimit) || cerr != nil && errors.Is(err, cerr) {
			return nil
		}
		return []string{fmt.Sprintf("job: Submit failed: %v", err)}
	}
	a.accepted.Add(1)
	select {
	case <-done:
		return bad
	case <-time.After(time.Minute):
		return []string{"job: an accepted job had not run a minute later"}
	}
}

// checkAdapters samples the adapters' Gates: no tenant above its cap.
func (a *adapters) check(rc *runCtx) {
	for _, g := range []*pool.Gate{a.httpGate, a.jobGate} {
		for _, t := range rc.env.tenants {
			if st, ok := g.TenantStat(t); ok && st.InUse > st.Limit {
				rc.violate(-1, fmt.Sprintf("adapter gate: tenant %s holds %d slots, its cap is %d", t, st.InUse, st.Limit))
			}
		}
	}
}

// close ends the adapters at the end of a run and checks them: every
// accepted job ran and none failed to OnError, no slot of either Gate is
// held or waited for.
func (a *adapters) close(rc *runCtx) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dropped, err := a.runner.Close(ctx)
	if dropped > 0 || err != nil {
		rc.violate(-1, fmt.Sprintf("at the end: the Runner dropped %d queued jobs (%v)", dropped, err))
	}
	if acc, ran := a.accepted.Load(), a.ran.Load(); acc != ran {
		rc.violate(-1, fmt.Sprintf("at the end: the Runner accepted %d jobs and ran %d", acc, ran))
	}
	if n := a.onErrors.Load(); n > 0 {
		a.mu.Lock()
		rc.violate(-1, fmt.Sprintf("the Runner told OnError %d times, first: %s", n, a.firstOnError))
		a.mu.Unlock()
	}
	a.srv.Close() // waits for the handlers
	for name, g := range map[string]*pool.Gate{"middleware": a.httpGate, "Runner": a.jobGate} {
		if st := g.Stat(); st.InUse != 0 || st.Waiting != 0 {
			rc.violate(-1, fmt.Sprintf("at the end: the %s's Gate has %d slots in use, %d waiting", name, st.InUse, st.Waiting))
		}
		g.Close()
	}
}
