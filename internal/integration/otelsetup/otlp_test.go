package otelsetup_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/tracing/otelsetup"
)

// TestStartOTLPHTTPToLoopbackWithoutTLS sends a span to an in-process
// OTLP/HTTP receiver given as host:port on loopback: it must arrive in clear
// text at /v1/traces with the configured headers, with no Insecure setting.
func TestStartOTLPHTTPToLoopbackWithoutTLS(t *testing.T) {
	var (
		mu    sync.Mutex
		paths []string
		keys  []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		keys = append(keys, r.Header.Get("X-Api-Key"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()

	o, err := otelsetup.StartOTLP(context.Background(), otelsetup.OTLPConfig{
		Endpoint: strings.TrimPrefix(srv.URL, "http://"), Protocol: "http", ServiceName: "svc",
		Headers: map[string]string{"X-Api-Key": "k"}, NoMetrics: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, span := o.TracerProvider.Tracer("test").Start(context.Background(), "op")
	span.End()
	if err := o.Shutdown(context.Background()); err != nil { // flushes
		t.Fatalf("shutdown: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 || paths[0] != "/v1/traces" || keys[0] != "k" {
		t.Fatalf("receiver got %v with keys %v", paths, keys)
	}
}

// TestStartOTLPRejectsBadConfig: an unknown protocol or an endpoint that
// is neither host:port nor a URL is an error from StartOTLP, for spans
// alone as for both signals, not a failure at the first export.
func TestStartOTLPRejectsBadConfig(t *testing.T) {
	for _, cfg := range []otelsetup.OTLPConfig{
		{Protocol: "thrift", NoMetrics: true},
		{Endpoint: "no-port", NoMetrics: true},
		{Endpoint: "no-port"},
	} {
		if _, err := otelsetup.StartOTLP(context.Background(), cfg); err == nil || !strings.HasPrefix(err.Error(), "otelsetup: ") {
			t.Errorf("StartOTLP(%+v): %v", cfg, err)
		}
	}
}

// TestStartOTLPExportsMetricsToo sends a span and a metric to an in-process
// OTLP/HTTP receiver given as a URL: spans must reach /v1/traces and
// metrics /v1/metrics, and Shutdown must flush both.
func TestStartOTLPExportsMetricsToo(t *testing.T) {
	var (
		mu    sync.Mutex
		paths = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths[r.URL.Path]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()

	o, err := otelsetup.StartOTLP(context.Background(), otelsetup.OTLPConfig{
		Endpoint: srv.URL, Protocol: "http", ServiceName: "svc", MetricInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Options()) != 2 {
		t.Fatalf("Options: %d, want a tracer and a meter provider", len(o.Options()))
	}
	_, span := o.TracerProvider.Tracer("test").Start(context.Background(), "op")
	span.End()
	c, err := o.MeterProvider.Meter("test").Int64Counter("c")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 1)
	if err := o.Shutdown(context.Background()); err != nil { // flushes both
		t.Fatalf("shutdown: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if paths["/v1/traces"] != 1 || paths["/v1/metrics"] != 1 || len(paths) != 2 {
		t.Fatalf("receiver got %v, want one export each to /v1/traces and /v1/metrics", paths)
	}
}

// TestStartOTLPEitherSignalOff: NoTraces and NoMetrics leave the provider
// nil, and turning both off is an error rather than a setup that does nothing.
func TestStartOTLPEitherSignalOff(t *testing.T) {
	o, err := otelsetup.StartOTLP(context.Background(), otelsetup.OTLPConfig{NoTraces: true})
	if err != nil {
		t.Fatal(err)
	}
	if o.TracerProvider != nil || o.MeterProvider == nil {
		t.Errorf("NoTraces: tracer %v, meter %v", o.TracerProvider, o.MeterProvider)
	}
	shutdownNow(o)
	o, err = otelsetup.StartOTLP(context.Background(), otelsetup.OTLPConfig{NoMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	if o.TracerProvider == nil || o.MeterProvider != nil {
		t.Errorf("NoMetrics: tracer %v, meter %v", o.TracerProvider, o.MeterProvider)
	}
	shutdownNow(o)
	// gRPC has no paths: a URL's is no reason to fail.
	o, err = otelsetup.StartOTLP(context.Background(), otelsetup.OTLPConfig{Endpoint: "http://collector:4317/any"})
	if err != nil {
		t.Errorf("gRPC URL with a path: %v", err)
	} else {
		shutdownNow(o)
	}
	for _, cfg := range []otelsetup.OTLPConfig{
		{NoTraces: true, NoMetrics: true},
		{MetricInterval: -time.Second},
		{Endpoint: "http://collector:4318/custom", Protocol: "http"}, // metrics path unknown
		{Protocol: "thrift"},
	} {
		if _, err := otelsetup.StartOTLP(context.Background(), cfg); err == nil || !strings.HasPrefix(err.Error(), "otelsetup: ") {
			t.Errorf("StartOTLP(%+v): %v", cfg, err)
		}
	}
}

// shutdownNow stops o without waiting for the exports to a collector that
// is not there.
func shutdownNow(o *otelsetup.OTLP) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_ = o.Shutdown(ctx)
}

// TestStartOTLPMetricsEndpointFromEnvironment: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT
// sends metrics elsewhere than OTLPConfig.Endpoint, which still takes the spans.
func TestStartOTLPMetricsEndpointFromEnvironment(t *testing.T) {
	var (
		mu  sync.Mutex
		got = map[string][]string{}
	)
	receiver := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got[name] = append(got[name], r.URL.Path)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/x-protobuf")
			w.WriteHeader(http.StatusOK)
		}))
	}
	spans, metrics := receiver("spans"), receiver("metrics")
	defer spans.Close()
	defer metrics.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", metrics.URL+"/v1/metrics")

	o, err := otelsetup.StartOTLP(context.Background(), otelsetup.OTLPConfig{Endpoint: spans.URL, Protocol: "http"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := o.TracerProvider.Tracer("test").Start(context.Background(), "op")
	span.End()
	c, _ := o.MeterProvider.Meter("test").Int64Counter("c")
	c.Add(context.Background(), 1)
	if err := o.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got["spans"]) != 1 || got["spans"][0] != "/v1/traces" || len(got["metrics"]) != 1 || got["metrics"][0] != "/v1/metrics" {
		t.Errorf("exports: %v", got)
	}
}
