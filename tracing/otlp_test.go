package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tenantdb/tenantdb/tracing"
)

// TestSetupOTLPHTTPToLoopbackWithoutTLS sends a span to an in-process
// OTLP/HTTP receiver given as host:port on loopback: it must arrive in clear
// text at /v1/traces with the configured headers, with no Insecure setting.
func TestSetupOTLPHTTPToLoopbackWithoutTLS(t *testing.T) {
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

	tp, shutdown, err := tracing.SetupOTLP(context.Background(), tracing.OTLPConfig{
		Endpoint: strings.TrimPrefix(srv.URL, "http://"), Protocol: "http", ServiceName: "svc",
		Headers: map[string]string{"X-Api-Key": "k"},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tp.Tracer("test").Start(context.Background(), "op")
	span.End()
	if err := shutdown(context.Background()); err != nil { // flushes
		t.Fatalf("shutdown: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 || paths[0] != "/v1/traces" || keys[0] != "k" {
		t.Fatalf("receiver got %v with keys %v", paths, keys)
	}
}

func TestSetupOTLPRejectsBadConfig(t *testing.T) {
	for _, cfg := range []tracing.OTLPConfig{
		{Protocol: "thrift"},
		{Endpoint: "no-port"},
	} {
		if _, _, err := tracing.SetupOTLP(context.Background(), cfg); err == nil || !strings.HasPrefix(err.Error(), "tracing: ") {
			t.Errorf("SetupOTLP(%+v): %v", cfg, err)
		}
	}
}
