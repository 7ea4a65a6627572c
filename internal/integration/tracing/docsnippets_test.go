package tracing_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/internal/doctest"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
)

// snippetService is the service each documented tracing snippet runs in,
// as written, in place of SNIPPET: an HTTP server whose handler, wrapped in
// otelhttp as the docs suggest, runs a query for the X-Tenant header's
// tenant, and which on SIGTERM finishes its requests and returns, so that
// the snippet's deferred calls (the flush of spans) run.
const snippetService = `package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tracing"
	"github.com/tenantdb/tenantdb/tracing/otelsetup"
)

func main() {
	ctx := context.Background()
	pgxCfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := run(ctx, pgxCfg); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, pgxCfg *pgxpool.Config) error {
	var err error
	// SNIPPET
	if err != nil || p == nil {
		return fmt.Errorf("the snippet failed: %v", err)
	}
	http.Handle("GET /orders", otelhttp.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := tenantdb.WithTenant(r.Context(), r.Header.Get("X-Tenant"))
		if _, err := p.Exec(ctx, "select 1"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}), "GET /orders"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println("listening on", ln.Addr())
	srv := &http.Server{}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	sig, stopSignals := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stopSignals()
	select {
	case err := <-served:
		return err
	case <-sig.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
`

// docSnippet is a tracing snippet of the documentation.
type docSnippet struct {
	where, code string
}

// tracingSnippets returns the Go blocks of README's "Operating it" and of
// docs/observability.md, which set up tracing and metrics.
func tracingSnippets(t *testing.T) []docSnippet {
	var out []docSnippet
	for _, heading := range []string{"## Operating it", "# Tracing and metrics"} {
		for i, code := range doctest.GoBlocks(t, doctest.Section(t, heading)) {
			out = append(out, docSnippet{fmt.Sprintf("%q block %d", heading, i+1), code})
		}
	}
	if len(out) < 4 {
		t.Fatalf("found %d tracing snippets in the documentation, want README's and the three of docs/observability.md", len(out))
	}
	return out
}

// traceSpan is a span as Jaeger's query API returns it, with its place in
// its trace.
type traceSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	Tags []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
}

func (s traceSpan) tag(key string) (any, bool) {
	for _, t := range s.Tags {
		if t.Key == key {
			return t.Value, true
		}
	}
	return nil, false
}

func (s traceSpan) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// requestTrace finds, among Jaeger's traces of service, one whose request
// span has tenant's admission span (with its wait times) and a query span
// under it.
func requestTrace(ctx context.Context, queryURL, service, tenant string) error {
	u := queryURL + "/api/traces?" + url.Values{"service": {service}, "limit": {"100"}, "lookback": {"1h"},
		"tags": {fmt.Sprintf(`{"%s":"%s"}`, tracing.TenantKey, tenant)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Data []struct {
			Spans []traceSpan `json:"spans"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return err
	}
	var seen []string
	for _, tr := range body.Data {
		byID := map[string]traceSpan{}
		for _, s := range tr.Spans {
			byID[s.SpanID] = s
			seen = append(seen, s.OperationName)
		}
		var admitted, queried bool
		var request traceSpan
		for _, s := range tr.Spans {
			parent, ok := byID[s.parent()]
			if !ok || parent.OperationName != "GET /orders" {
				continue
			}
			request = parent
			switch {
			case s.OperationName == tracing.AcquireSpanName:
				id, _ := s.tag(string(tracing.TenantKey))
				_, waited := s.tag(string(tracing.TenantWaitKey))
				admitted = id == tenant && waited
			case strings.HasPrefix(s.OperationName, "SELECT"):
				queried = true
			}
		}
		if admitted && queried && request.parent() == "" {
			return nil
		}
	}
	return fmt.Errorf("no trace of %s has a request span with %s's admission span and a query under it; spans seen: %v", service, tenant, seen)
}

// TestDocTracingSnippetsReachJaeger builds each tracing snippet of README.md
// and docs/observability.md, as it stands, into an HTTP service, runs it
// against PostgreSQL and a real Jaeger, sends it requests and stops it with
// SIGTERM; Jaeger must then hold, for each snippet that exports spans, a
// trace with the request's span, the admission span (tenant, wait time) and
// the query under it (issue 32 item 1). The Prometheus snippet, which
// exports no spans, must serve the Tracer's metrics.
func TestDocTracingSnippetsReachJaeger(t *testing.T) {
	pg := postgres(t)
	j := tenantdbtest.StartJaeger(t)
	for i, sn := range tracingSnippets(t) {
		t.Run(fmt.Sprintf("snippet%d", i+1), func(t *testing.T) {
			t.Logf("%s:\n%s", sn.where, sn.code)
			src := strings.Replace(snippetService, "\t// SNIPPET\n", "\t"+strings.ReplaceAll(strings.TrimSpace(sn.code), "\n", "\n\t")+"\n", 1)
			exe := doctest.Executable(t, sn.where, map[string]string{"internal/integration/tracing/internal/docsnippet/main.go": src})
			cmd := exec.Command(exe)
			cmd.Env = append(os.Environ(), "DATABASE_URL="+pg.DSN,
				"OTEL_EXPORTER_OTLP_ENDPOINT=http://"+j.OTLPGRPCEndpoint, "OTEL_EXPORTER_OTLP_INSECURE=true",
				"OTEL_METRIC_EXPORT_INTERVAL=3600000")
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			lines := bufio.NewScanner(stdout)
			if !lines.Scan() {
				t.Fatalf("the service did not start: %v\n%s", cmd.Wait(), stderr.String())
			}
			addr := strings.TrimPrefix(lines.Text(), "listening on ")
			go func() {
				_, _ = io.Copy(io.Discard, stdout)
				exited <- cmd.Wait()
			}()
			defer func() { _ = cmd.Process.Kill() }()

			tenant := fmt.Sprintf("snippet%d", i+1)
			for range 3 {
				req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/orders", nil)
				req.Header.Set("X-Tenant", tenant)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("GET /orders: %s %s", resp.Status, body)
				}
			}
			metricsOnly := strings.Contains(sn.code, "NewPrometheusExporter")
			if metricsOnly {
				resp, err := http.Get("http://" + addr + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "db_client_connection_use_time_seconds_count") {
					t.Fatalf("GET /metrics: %s, without the Tracer's metrics:\n%.2000s", resp.Status, body)
				}
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				if err != nil {
					t.Fatalf("the service did not stop cleanly: %v\n%s", err, stderr.String())
				}
			case <-time.After(probeTimeout):
				t.Fatalf("the service did not stop within %v of SIGTERM\n%s", probeTimeout, stderr.String())
			}
			if metricsOnly {
				return
			}
			tenantdbtest.EventuallyNoError(t, time.Minute, "Jaeger has the request's trace", func(ctx context.Context) error {
				return requestTrace(ctx, j.QueryURL, "orders", tenant)
			})
		})
	}
}
