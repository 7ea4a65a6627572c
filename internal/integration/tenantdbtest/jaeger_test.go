package tenantdbtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// sendSpan exports one span named op for service through exp and flushes it.
func sendSpan(t *testing.T, exp sdktrace.SpanExporter, service, op string) {
	t.Helper()
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))),
	)
	_, span := tp.Tracer("github.com/tenantdb/tenantdb/tenantdb/tenantdbtest").Start(t.Context(), op)
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatalf("export span for %s: %v", service, err)
	}
}

// findOperation asks Jaeger's query API for service's traces and reports
// whether one has a span named op.
func findOperation(ctx context.Context, queryURL, service, op string) error {
	u := queryURL + "/api/traces?" + url.Values{"service": {service}, "lookback": {"1h"}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	var body struct {
		Data []struct {
			Spans []struct {
				OperationName string `json:"operationName"`
			} `json:"spans"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	for _, tr := range body.Data {
		for _, s := range tr.Spans {
			if s.OperationName == op {
				return nil
			}
		}
	}
	return fmt.Errorf("no span %q for service %q yet (%d traces)", op, service, len(body.Data))
}

func TestJaegerAcceptsOTLPAndReturnsSpans(t *testing.T) {
	t.Parallel()
	j := tenantdbtest.StartJaeger(t)
	if j.Container == nil || j.Image == "" {
		t.Fatalf("StartJaeger started no container: %+v", j)
	}

	httpExp, err := otlptracehttp.New(t.Context(), otlptracehttp.WithEndpoint(j.OTLPHTTPEndpoint), otlptracehttp.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	sendSpan(t, httpExp, "tenantdbtest-http", "op-over-http")

	grpcExp, err := otlptracegrpc.New(t.Context(), otlptracegrpc.WithEndpoint(j.OTLPGRPCEndpoint), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	sendSpan(t, grpcExp, "tenantdbtest-grpc", "op-over-grpc")

	tenantdbtest.EventuallyNoError(t, 30*time.Second, "span sent over OTLP/HTTP", func(ctx context.Context) error {
		return findOperation(ctx, j.QueryURL, "tenantdbtest-http", "op-over-http")
	})
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "span sent over OTLP/gRPC", func(ctx context.Context) error {
		return findOperation(ctx, j.QueryURL, "tenantdbtest-grpc", "op-over-grpc")
	})
}

func TestJaegerExistingServerFromEnv(t *testing.T) {
	t.Setenv("TENANTDB_JAEGER_QUERY_URL", "http://jaeger.example:16686")
	t.Setenv("TENANTDB_JAEGER_OTLP_HTTP_ENDPOINT", "collector.example:14318")
	j := tenantdbtest.StartJaeger(t)
	if j.Container != nil || j.QueryURL != "http://jaeger.example:16686" ||
		j.OTLPGRPCEndpoint != "jaeger.example:4317" || j.OTLPHTTPEndpoint != "collector.example:14318" {
		t.Errorf("with TENANTDB_JAEGER_QUERY_URL set: %+v", j)
	}
}
