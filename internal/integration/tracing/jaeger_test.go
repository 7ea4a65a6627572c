package tracing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
	"github.com/tenantdb/tenantdb/tracing/otelsetup"
)

// jaegerSpan is a span as Jaeger's query API returns it.
type jaegerSpan struct {
	OperationName string `json:"operationName"`
	Tags          []struct {
		Key   string `json:"key"`
		Type  string `json:"type"`
		Value any    `json:"value"`
	} `json:"tags"`
}

func (s jaegerSpan) tag(key string) (any, bool) {
	for _, t := range s.Tags {
		if t.Key == key {
			return t.Value, true
		}
	}
	return nil, false
}

// jaegerSpans returns every span of service's traces in the last hour.
func jaegerSpans(ctx context.Context, queryURL, service string) ([]jaegerSpan, error) {
	u := queryURL + "/api/traces?" + url.Values{
		"service": {service}, "limit": {"1000"}, "lookback": {"1h"},
	}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	var body struct {
		Data []struct {
			Spans []jaegerSpan `json:"spans"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	var spans []jaegerSpan
	for _, tr := range body.Data {
		spans = append(spans, tr.Spans...)
	}
	return spans, nil
}

// pollJaeger asks Jaeger for service's spans until done accepts them or a
// minute has passed: export and indexing are asynchronous.
func pollJaeger(t *testing.T, queryURL, service string, done func([]jaegerSpan) error) []jaegerSpan {
	t.Helper()
	var spans []jaegerSpan
	tenantdbtest.EventuallyNoError(t, time.Minute, fmt.Sprintf("Jaeger at %s has the spans of %s", queryURL, service), func(ctx context.Context) error {
		got, err := jaegerSpans(ctx, queryURL, service)
		if err != nil {
			return err
		}
		if err := done(got); err != nil {
			return err
		}
		spans = got
		return nil
	})
	return spans
}

func byTenant(spans []jaegerSpan, op, tenant string) []jaegerSpan {
	var out []jaegerSpan
	for _, s := range spans {
		if v, _ := s.tag(string(tracing.TenantKey)); s.OperationName == op && v == tenant {
			out = append(out, s)
		}
	}
	return out
}

// exportTo returns a TracerProvider that sends spans (only: Jaeger takes
// no metrics) as cfg says, flushed when the test ends.
func exportTo(t *testing.T, cfg otelsetup.OTLPConfig) *sdktrace.TracerProvider {
	t.Helper()
	cfg.NoMetrics = true
	o, err := otelsetup.StartOTLP(context.Background(), cfg)
	if err != nil {
		t.Fatalf("StartOTLP: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := o.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return o.TracerProvider
}

// TestJaegerShowsNoisyTenantWaitingAndQuietTenantNot runs a flooding tenant
// and a quiet one through tenantdb with OTLP/gRPC export to a real Jaeger,
// and reads the spans back from Jaeger's query API: both tenants' admission
// and query spans arrive with their tenant tags and wait times; the noisy
// tenant's admission spans show its waits and rejections, the quiet
// tenant's none. A second, smaller run checks OTLP/HTTP.
func TestJaegerShowsNoisyTenantWaitingAndQuietTenantNot(t *testing.T) {
	j := tenantdbtest.StartJaeger(t)
	service := fmt.Sprintf("tenantdb-tracing-test-%d", time.Now().UnixNano())
	tp := exportTo(t, otelsetup.OTLPConfig{Endpoint: j.OTLPGRPCEndpoint, Protocol: otelsetup.ProtocolGRPC, ServiceName: service})
	tr := tracing.New(tracing.WithTracerProvider(tp), tracing.WithMeterProvider(noop.NewMeterProvider()))
	p := newTracedPool(t, tr, nil, 4, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{
			"free":     {MaxConns: 1, MaxWaiting: 2}, // a bounded queue of two, then rejected
			"standard": {MaxConns: 2},
		},
		DefaultPlan: "standard",
		Lookup: func(_ context.Context, id string) (tenantdb.Tenant, error) {
			if id == "noisy" {
				return tenantdb.Tenant{Plan: "free"}, nil
			}
			return tenantdb.Tenant{}, nil
		},
	})
	app := tp.Tracer("app")
	request := func(tenant, sql string) error {
		ctx, span := app.Start(tenantdb.WithTenant(context.Background(), tenant), "handle "+tenant)
		defer span.End()
		_, err := p.Exec(ctx, sql)
		return err
	}

	// The noisy tenant's first request holds its only connection while
	// eight more flood in: two wait in its queue, six are rejected at once.
	hctx, hold := app.Start(tenantdb.WithTenant(context.Background(), "noisy"), "handle noisy")
	conn, err := p.Acquire(hctx)
	if err != nil {
		t.Fatal(err)
	}
	const flood = 8
	errs := make(chan error, flood)
	var wg sync.WaitGroup
	for range flood {
		wg.Go(func() { errs <- request("noisy", "select pg_sleep(0.05)") })
	}
	tenantdbtest.Eventually(t, probeTimeout, "the flood is queued and rejected", func() bool {
		s := p.TenantStat("noisy")
		return s.Waiting == 2 && s.Rejected == flood-2
	})
	// Meanwhile the quiet tenant is served at once.
	const quiet = 3
	for range quiet {
		if err := request("quiet", "select 1"); err != nil {
			t.Fatalf("quiet tenant: %v", err)
		}
	}
	if _, err := conn.Exec(hctx, "select pg_sleep(0.05)"); err != nil {
		t.Fatal(err)
	}
	conn.Release()
	hold.End()
	wg.Wait()
	close(errs)
	var rejected int
	for err := range errs {
		if errors.Is(err, tenantdb.ErrOverLimit) {
			rejected++
		} else if err != nil {
			t.Fatalf("noisy tenant: %v", err)
		}
	}
	if rejected != flood-2 {
		t.Fatalf("%d noisy requests rejected, want %d", rejected, flood-2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tp.ForceFlush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}

	query := "SELECT " + postgres(t).Database
	spans := pollJaeger(t, j.QueryURL, service, func(spans []jaegerSpan) error {
		want := []struct {
			op, tenant string
			n          int
		}{
			{tracing.AcquireSpanName, "noisy", 1 + flood},
			{tracing.AcquireSpanName, "quiet", quiet},
			{query, "noisy", 1 + 2},
			{query, "quiet", quiet},
		}
		for _, w := range want {
			if got := len(byTenant(spans, w.op, w.tenant)); got < w.n {
				return fmt.Errorf("%d %q spans of %s so far, want %d", got, w.op, w.tenant, w.n)
			}
		}
		return nil
	})

	// Every admission span carries both waits; the outcome says the rest.
	waits := func(s jaegerSpan) (tenantWait, globalWait float64, outcome string) {
		tw, ok1 := s.tag(string(tracing.TenantWaitKey))
		gw, ok2 := s.tag(string(tracing.GlobalWaitKey))
		oc, _ := s.tag(string(tracing.OutcomeKey))
		if !ok1 || !ok2 {
			t.Fatalf("admission span without wait tags: %+v", s.Tags)
		}
		return tw.(float64), gw.(float64), fmt.Sprint(oc)
	}
	var noisyWaited, noisyRejected int
	for _, s := range byTenant(spans, tracing.AcquireSpanName, "noisy") {
		tw, _, outcome := waits(s)
		switch {
		case outcome == "rejected":
			noisyRejected++
		case outcome == "acquired" && tw > 0:
			noisyWaited++
		}
	}
	if noisyWaited != 2 || noisyRejected != flood-2 {
		t.Errorf("noisy admission spans: %d waited, %d rejected; want 2 and %d", noisyWaited, noisyRejected, flood-2)
	}
	for _, s := range byTenant(spans, tracing.AcquireSpanName, "quiet") {
		if tw, gw, outcome := waits(s); tw != 0 || gw != 0 || outcome != "acquired" {
			t.Errorf("quiet admission span: waited %vs + %vs, %s", tw, gw, outcome)
		}
	}
	for _, s := range byTenant(spans, query, "quiet") {
		if v, _ := s.tag("db.system.name"); v != "postgresql" {
			t.Errorf("quiet query span: db.system.name %v", v)
		}
	}

	t.Run("OTLP over HTTP", func(t *testing.T) {
		service := service + "-http"
		tp := exportTo(t, otelsetup.OTLPConfig{Endpoint: j.OTLPHTTPEndpoint, Protocol: otelsetup.ProtocolHTTP, ServiceName: service})
		tr := tracing.New(tracing.WithTracerProvider(tp), tracing.WithMeterProvider(noop.NewMeterProvider()))
		p := newTracedPool(t, tr, nil, 2, tenantdb.Config{})
		ctx, span := tp.Tracer("app").Start(tenantdb.WithTenant(context.Background(), "quiet"), "handle quiet")
		if _, err := p.Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
		span.End()
		if err := tp.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		pollJaeger(t, j.QueryURL, service, func(spans []jaegerSpan) error {
			if len(byTenant(spans, tracing.AcquireSpanName, "quiet")) == 0 || len(byTenant(spans, query, "quiet")) == 0 {
				return fmt.Errorf("no admission and query spans yet (%d spans)", len(spans))
			}
			return nil
		})
	})
}
