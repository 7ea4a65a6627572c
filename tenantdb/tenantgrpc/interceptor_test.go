package tenantgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tenantdb/tenantdb/internal/poll"
	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/pool/poolhttp"
	"github.com/tenantdb/tenantdb/tenantdb/tenantgrpc"
)

// blockingHealth is a Health service whose Check blocks until released (or
// the client goes), panics for the service "panic", and whose Watch sends
// one update and then holds the stream until the client goes. Each call
// reports the tenant its context carries.
type blockingHealth struct {
	healthpb.UnimplementedHealthServer
	release chan struct{}
	tenants chan string
	served  atomic.Int64
}

func (h *blockingHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	id, _ := pool.TenantFrom(ctx)
	h.tenants <- id
	if req.Service == "panic" {
		panic("handler bug")
	}
	select {
	case <-h.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	h.served.Add(1)
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *blockingHealth) Watch(req *healthpb.HealthCheckRequest, ss healthpb.Health_WatchServer) error {
	id, _ := pool.TenantFrom(ss.Context())
	h.tenants <- id
	if err := ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
		return err
	}
	<-ss.Context().Done()
	return nil
}

type env struct {
	g      *pool.Gate
	h      *blockingHealth
	client healthpb.HealthClient
	panics atomic.Int64 // recovered by the outer interceptor
}

// newEnv starts a real gRPC server on loopback with the interceptors, under
// an outer interceptor that turns panics into codes.Internal as a recovery
// middleware would, and checks the slot was released before it saw them.
func newEnv(t *testing.T, cfg pool.Config) *env {
	t.Helper()
	g, err := pool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	e := &env{g: g, h: &blockingHealth{release: make(chan struct{}), tenants: make(chan string, 100)}}
	recovery := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				e.panics.Add(1)
				if s := g.Stat(); s.InUse != 0 {
					t.Errorf("slot still held when the panic left the interceptor: %d", s.InUse)
				}
				err = status.Errorf(codes.Internal, "panic: %v", p)
			}
		}()
		return handler(ctx, req)
	}
	tenant := tenantgrpc.FromMetadata("x-tenant-id")
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(recovery, tenantgrpc.UnaryServerInterceptor(g, tenant)),
		grpc.ChainStreamInterceptor(tenantgrpc.StreamServerInterceptor(g, tenant)),
	)
	healthpb.RegisterHealthServer(srv, e.h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.client = healthpb.NewHealthClient(conn)
	return e
}

func as(tenant string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "x-tenant-id", tenant)
}

func (e *env) checkAsync(ctx context.Context, service string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		_, err := e.client.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		ch <- err
	}()
	return ch
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, time.Millisecond, what, cond)
}

func (e *env) inUse(id string, n int) func() bool {
	return func() bool { s, _ := e.g.TenantStat(id); return s.InUse == n }
}

// TestUnaryOverLimit: with a tenant's only slot held, its next call is
// ResourceExhausted with a RetryInfo and never reaches the handler; another
// tenant is served; the slot comes back when the handler returns.
func TestUnaryOverLimit(t *testing.T) {
	e := newEnv(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"p": {MaxConns: 1}}})
	first := e.checkAsync(as("acme"), "")
	if got := <-e.h.tenants; got != "acme" {
		t.Fatalf("handler's context carries %q, want acme", got)
	}
	_, err := e.client.Check(as("acme"), &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("over the limit: %v; want ResourceExhausted", err)
	}
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	if retry == nil || retry.RetryDelay.AsDuration() <= 0 {
		t.Fatalf("no positive RetryInfo in %v", st.Details())
	}
	other := e.checkAsync(as("globex"), "")
	<-e.h.tenants
	close(e.h.release)
	for _, ch := range []<-chan error{first, other} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "acme's slot is released", e.inUse("acme", 0))
	if n := e.h.served.Load(); n != 2 {
		t.Fatalf("handler served %d, want 2", n)
	}
}

// TestUnaryRefusals: no tenant and an invalid one are Unauthenticated, a
// closed gate Unavailable; none reaches the handler.
func TestUnaryRefusals(t *testing.T) {
	e := newEnv(t, pool.Config{Capacity: 2})
	close(e.h.release)
	for name, ctx := range map[string]context.Context{
		"no metadata":  context.Background(),
		"over-long id": as(strings.Repeat("a", 200)),
	} {
		if _, err := e.client.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("%s: %v; want Unauthenticated", name, err)
		}
	}
	e.g.Close()
	if _, err := e.client.Check(as("acme"), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("closed gate: %v; want Unavailable", err)
	}
	if len(e.h.tenants) != 0 || e.g.Stat().Acquired != 0 {
		t.Fatal("a refused call reached the handler or took a slot")
	}
}

// TestUnaryReleasesOnPanicAndDisconnect: a handler that panics (recovered
// by an outer interceptor, which checks the slot is free by then) and a
// client that cancels mid-call both leave nothing held.
func TestUnaryReleasesOnPanicAndDisconnect(t *testing.T) {
	e := newEnv(t, pool.Config{Capacity: 2, Plans: map[string]pool.Plan{"p": {MaxConns: 1}}})
	if _, err := e.client.Check(as("acme"), &healthpb.HealthCheckRequest{Service: "panic"}); status.Code(err) != codes.Internal {
		t.Fatalf("panicking handler: %v; want Internal from the recovery interceptor", err)
	}
	<-e.h.tenants
	if e.panics.Load() != 1 {
		t.Fatal("the panic did not reach the outer interceptor")
	}
	eventually(t, "the panicking call's slot is released", e.inUse("acme", 0))

	ctx, cancel := context.WithCancel(as("acme"))
	call := e.checkAsync(ctx, "")
	<-e.h.tenants
	if s, _ := e.g.TenantStat("acme"); s.InUse != 1 {
		t.Fatalf("in use %d while the call runs, want 1", s.InUse)
	}
	cancel()
	if err := <-call; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v", err)
	}
	eventually(t, "the gone client's slot is released", e.inUse("acme", 0))
	if s, _ := e.g.TenantStat("acme"); s.Acquired != 2 {
		t.Fatalf("acquired %d, want 2", s.Acquired)
	}
}

// TestStreamHoldsSlotForItsLife: a Watch stream holds its tenant's slot
// from its first message until the client cancels it; a second stream of
// the tenant meanwhile is ResourceExhausted; the tenant in the stream's
// context is the caller's.
func TestStreamHoldsSlotForItsLife(t *testing.T) {
	e := newEnv(t, pool.Config{Capacity: 4, Plans: map[string]pool.Plan{"p": {MaxConns: 1}}})
	ctx, cancel := context.WithCancel(as("acme"))
	defer cancel()
	w, err := e.client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	if got := <-e.h.tenants; got != "acme" {
		t.Fatalf("stream's context carries %q", got)
	}
	if s, _ := e.g.TenantStat("acme"); s.InUse != 1 {
		t.Fatalf("in use %d with the stream open, want 1", s.InUse)
	}
	w2, err := e.client.Watch(as("acme"), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w2.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream: %v; want ResourceExhausted", err)
	}
	noTenant, err := e.client.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = noTenant.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("stream without tenant: %v; want Unauthenticated", err)
	}
	cancel()
	if _, err := w.Recv(); status.Code(err) != codes.Canceled && !errors.Is(err, context.Canceled) {
		t.Fatalf("after cancel: %v", err)
	}
	eventually(t, "the stream's slot is released", e.inUse("acme", 0))
}

// TestStatusHidesLookupErrors: whatever Lookup fails with (an outage, an
// unknown tenant wrapping pool.ErrInvalidTenant, its own timeout), the
// client gets the right code and none of Lookup's own text, which may name
// hosts, queries or credentials.
func TestStatusHidesLookupErrors(t *testing.T) {
	const secret = "10.9.8.7:5432 password=hunter2"
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"outage", errors.New("dial " + secret), codes.Unavailable},
		{"unknown tenant", fmt.Errorf("%w: not in %s", pool.ErrInvalidTenant, secret), codes.Unauthenticated},
		{"lookup timeout", fmt.Errorf("query %s: %w", secret, context.DeadlineExceeded), codes.Unavailable},
	} {
		e := newEnv(t, pool.Config{Capacity: 2, Lookup: func(context.Context, string) (pool.Tenant, error) {
			return pool.Tenant{}, tc.err
		}})
		_, err := e.client.Check(as("acme"), &healthpb.HealthCheckRequest{})
		if st := status.Convert(err); st.Code() != tc.want || strings.Contains(st.Message(), "hunter2") || strings.Contains(st.Message(), "10.9.8.7") {
			t.Errorf("%s: %v; want %v without Lookup's text", tc.name, err, tc.want)
		}
	}
}

// TestOneErrNoTenant: a missing tenant from every adapter matches one
// sentinel, pool.ErrNoTenant, and each adapter's old name. (tenantdb's name
// is checked in tenantdb's tests: importing it here would put pgx in this
// module's graph.)
func TestOneErrNoTenant(t *testing.T) {
	_, grpcErr := tenantgrpc.FromMetadata("x-tenant-id")(context.Background(), metadata.MD{})
	g, err := pool.New(pool.Config{Capacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:1/", nil)
	_, httpErr := (&poolhttp.Transport{Gate: g}).RoundTrip(req)
	for name, err := range map[string]error{"tenantgrpc": grpcErr, "poolhttp": httpErr} {
		for _, target := range []error{pool.ErrNoTenant, poolhttp.ErrNoTenant, tenantgrpc.ErrNoTenant} {
			if !errors.Is(err, target) {
				t.Errorf("%s: %v does not match %v", name, err, target)
			}
		}
	}
}

// TestSkipMethods: a skipped method is served without a tenant and takes no
// slot; the others are still refused without one.
func TestSkipMethods(t *testing.T) {
	g, err := pool.New(pool.Config{Capacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	h := &blockingHealth{release: make(chan struct{}), tenants: make(chan string, 100)}
	close(h.release)
	skip := tenantgrpc.Skip(func(_ context.Context, m string) bool { return m == "/grpc.health.v1.Health/Check" })
	tenant := tenantgrpc.FromMetadata("x-tenant-id")
	srv := grpc.NewServer(grpc.UnaryInterceptor(tenantgrpc.UnaryServerInterceptor(g, tenant, skip)),
		grpc.StreamInterceptor(tenantgrpc.StreamServerInterceptor(g, tenant, skip)))
	healthpb.RegisterHealthServer(srv, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("skipped method without a tenant: %v", err)
	}
	w, err := client.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a method not skipped without a tenant: %v; want Unauthenticated", err)
	}
	if s := g.Stat(); s.Acquired != 0 {
		t.Fatalf("acquired %d, want 0", s.Acquired)
	}
}
