package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/pool/poolhttp"
)

// The http-* scenarios run the guide's experiment one layer up, as it was
// first written: HTTP requests through poolhttp.Middleware to a handler that
// sleeps for the request's duration, sent by a real HTTP client over
// loopback. No database is involved.

// httpShared is the shared limit alone: every request in one bucket of 20,
// first come first served, as a global limiter does.
func httpShared(w workload) (pool.Config, func(*http.Request) (string, error)) {
	return pool.Config{
		Capacity: sharedConns,
		Plans:    map[string]pool.Plan{"global": {MaxConns: sharedConns, MaxWaiting: pool.Unbounded}},
	}, func(*http.Request) (string, error) { return "everyone", nil }
}

// httpQueue: 10 per tenant, the excess waits in a queue large enough for the burst.
func httpQueue(w workload) (pool.Config, func(*http.Request) (string, error)) {
	return pool.Config{
		Capacity: sharedConns,
		Plans:    map[string]pool.Plan{"standard": {MaxConns: perTenantCap, MaxWaiting: w.noisyN}},
	}, tenantHeader
}

// httpReject: 10 per tenant, the excess answered 429 at once.
func httpReject(workload) (pool.Config, func(*http.Request) (string, error)) {
	return pool.Config{
		Capacity: sharedConns,
		Plans:    map[string]pool.Plan{"interactive": {MaxConns: perTenantCap}},
	}, tenantHeader
}

func tenantHeader(r *http.Request) (string, error) {
	if id := r.Header.Get("X-Tenant"); id != "" {
		return id, nil
	}
	return "", errors.New("no X-Tenant header")
}

// sleepHandler sleeps for the request's d parameter (microseconds), or
// until the client goes.
func sleepHandler(w http.ResponseWriter, r *http.Request) {
	us, err := strconv.ParseInt(r.URL.Query().Get("d"), 10, 64)
	if err != nil {
		http.Error(w, "bad d", http.StatusBadRequest)
		return
	}
	t := time.NewTimer(time.Duration(us) * time.Microsecond)
	defer t.Stop()
	select {
	case <-t.C:
		io.WriteString(w, "done\n")
	case <-r.Context().Done():
	}
}

// rejectedError is a 429 as the client saw it; it matches pool.ErrOverLimit
// so that the workload counts it as a rejection.
type rejectedError struct{ retryAfter int }

func (e rejectedError) Error() string        { return fmt.Sprintf("429, Retry-After %d", e.retryAfter) }
func (e rejectedError) Is(target error) bool { return target == pool.ErrOverLimit }

func runHTTP(plans func(workload) (pool.Config, func(*http.Request) (string, error))) func(context.Context, *environment, string) ([]result, error) {
	return func(ctx context.Context, env *environment, name string) ([]result, error) {
		cfg, tenantOf := plans(env.work)
		if env.tracer != nil {
			cfg.Tracer = env.tracer // the same tracer as the database scenarios'
		}
		g, err := pool.New(cfg)
		if err != nil {
			return nil, err
		}
		defer g.Close()

		// warm holds requests until n of them are in, so that the client
		// opens n connections before the flood: the measurement is of the
		// bulkhead, not of TCP handshakes.
		var warmed atomic.Int64
		warmN := int64(env.work.noisyN + env.work.quietN + 10)
		allIn := make(chan struct{})
		mux := http.NewServeMux()
		// The server's own time to answer 429, from the request's arrival
		// in the handler chain to the written response: what the client
		// sees on top of it is its own scheduling and the loopback.
		var rejMu sync.Mutex
		var serverRejects []time.Duration
		mw := poolhttp.Middleware(g, tenantOf)(http.HandlerFunc(sleepHandler))
		mux.HandleFunc("/work", func(w http.ResponseWriter, r *http.Request) {
			t0 := time.Now()
			sw := &statusWriter{ResponseWriter: w}
			mw.ServeHTTP(sw, r)
			if sw.status == http.StatusTooManyRequests {
				d := time.Since(t0)
				rejMu.Lock()
				serverRejects = append(serverRejects, d)
				rejMu.Unlock()
			}
		})
		mux.HandleFunc("/warm", func(w http.ResponseWriter, r *http.Request) {
			if warmed.Add(1) == warmN {
				close(allIn)
			}
			select {
			case <-allIn:
			case <-r.Context().Done():
			}
		})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		srv := &http.Server{Handler: mux}
		go srv.Serve(ln)
		defer srv.Close()
		base := "http://" + ln.Addr().String()
		tr := &http.Transport{MaxIdleConns: int(warmN) * 2, MaxIdleConnsPerHost: int(warmN) * 2, IdleConnTimeout: time.Minute}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr}

		if err := warmConns(ctx, client, base, int(warmN)); err != nil {
			return nil, err
		}
		rows := env.measure(ctx, name, func(ctx context.Context, tenant string, d time.Duration) error {
			return httpCall(ctx, client, base, tenant, d)
		})
		rejMu.Lock()
		if len(serverRejects) > 0 {
			rows[0].MaxRejectServer = ms(slices.Max(serverRejects)) // rows[0] is the noisy tenant's
			rows[0].P99RejectServer = ms(percentile(serverRejects, 99))
		}
		rejMu.Unlock()
		if s := g.Stat(); s.InUse != 0 || s.Waiting != 0 {
			return nil, fmt.Errorf("after the run %d slots are in use and %d waiting", s.InUse, s.Waiting)
		}
		return rows, nil
	}
}

func warmConns(ctx context.Context, c *http.Client, base string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/warm", nil)
			resp, err := c.Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return fmt.Errorf("warming up connections: %w", err)
		}
	}
	return nil
}

// httpCall sends one request and turns its answer into the workload's
// terms: nil for 200, an error matching pool.ErrOverLimit for a 429 with a
// valid Retry-After, any other error otherwise.
func httpCall(ctx context.Context, c *http.Client, base, tenant string, d time.Duration) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/work?d=%d", base, d.Microseconds()), nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Tenant", tenant)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusTooManyRequests:
		s, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if err != nil || s < 1 {
			return fmt.Errorf("429 without a valid Retry-After (%q)", resp.Header.Get("Retry-After"))
		}
		return rejectedError{retryAfter: s}
	default:
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}
