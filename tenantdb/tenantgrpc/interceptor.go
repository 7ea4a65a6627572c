package tenantgrpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tenantdb/tenantdb/pool"
)

// TenantFunc returns the tenant of an incoming call from its metadata (md
// is never nil) or its context (peer, TLS or auth info). An error refuses
// the call with codes.Unauthenticated. It should authenticate the caller:
// a verified token's claim, not a header a client may choose freely.
type TenantFunc func(ctx context.Context, md metadata.MD) (string, error)

// ErrNoTenant is returned by the TenantFunc of FromMetadata when the key is
// missing or empty. It is pool.ErrNoTenant, the sentinel every adapter
// shares.
var ErrNoTenant = pool.ErrNoTenant

// FromMetadata returns a TenantFunc that reads the first value of key (a
// lowercase metadata key such as "x-tenant-id"). It trusts the client; use
// it behind an authenticating interceptor or proxy that sets the key.
func FromMetadata(key string) TenantFunc {
	return func(_ context.Context, md metadata.MD) (string, error) {
		if v := md.Get(key); len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", fmt.Errorf("tenantgrpc: %w in metadata: %q", ErrNoTenant, key)
	}
}

// UnaryServerInterceptor admits every unary call against g for the tenant
// tenant returns, and runs the handler holding one of that tenant's slots,
// released when the handler returns or panics (the panic goes on). The
// handler's context carries the tenant (pool.TenantFrom,
// tenantdb.TenantFrom). A call that is not admitted never reaches the
// handler; its status is the one Status gives.
func UnaryServerInterceptor(g *pool.Gate, tenant TenantFunc, opts ...Option) grpc.UnaryServerInterceptor {
	mustConfig(g, tenant)
	o := options(opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if o.skip != nil && o.skip(ctx, info.FullMethod) {
			return handler(ctx, req)
		}
		ctx, permit, err := admit(ctx, g, tenant)
		if err != nil {
			return nil, err
		}
		defer permit.Release()
		return handler(ctx, req)
	}
}

// StreamServerInterceptor admits every stream as UnaryServerInterceptor
// admits a call: the slot is held for the stream's whole life, until the
// handler returns (the client going away cancels the stream's context).
func StreamServerInterceptor(g *pool.Gate, tenant TenantFunc, opts ...Option) grpc.StreamServerInterceptor {
	mustConfig(g, tenant)
	o := options(opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if o.skip != nil && o.skip(ss.Context(), info.FullMethod) {
			return handler(srv, ss)
		}
		ctx, permit, err := admit(ss.Context(), g, tenant)
		if err != nil {
			return err
		}
		defer permit.Release()
		return handler(srv, &tenantStream{ServerStream: ss, ctx: ctx})
	}
}

// Option configures the interceptors.
type Option func(*config)

type config struct {
	skip func(ctx context.Context, fullMethod string) bool
}

func options(opts []Option) config {
	var c config
	for _, opt := range opts {
		opt(&c)
	}
	return c
}

// Skip makes the interceptors pass the calls for which skip returns true
// (health checks, reflection: by fullMethod, "/package.Service/Method")
// straight to the handler, unadmitted and without a tenant, as
// go-grpc-middleware's selector does.
func Skip(skip func(ctx context.Context, fullMethod string) bool) Option {
	return func(c *config) { c.skip = skip }
}

func mustConfig(g *pool.Gate, tenant TenantFunc) {
	if g == nil || tenant == nil {
		panic("tenantgrpc: an interceptor needs a Gate and a TenantFunc")
	}
}

// admit reads the tenant and takes its slot; ctx governs the wait.
func admit(ctx context.Context, g *pool.Gate, tenant TenantFunc) (context.Context, pool.Permit, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if md == nil {
		md = metadata.MD{}
	}
	id, err := tenant(ctx, md)
	if err != nil {
		return ctx, pool.Permit{}, status.Error(codes.Unauthenticated, "no tenant: "+err.Error())
	}
	ctx = pool.WithTenant(ctx, id)
	permit, err := g.Acquire(ctx, id)
	if err != nil {
		if ctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			// Not the call's context: Lookup's own, say. The call may retry.
			return ctx, pool.Permit{}, status.Error(codes.Unavailable, unavailable)
		}
		return ctx, pool.Permit{}, Status(err).Err()
	}
	return ctx, permit, nil
}

// Status is the gRPC status of a call refused because of err, an error from
// pool.Gate.Acquire: codes.ResourceExhausted with an errdetails.RetryInfo
// (OverLimitError.RetryAfter) for a tenant over its cap;
// codes.Unauthenticated for an invalid tenant ID; Canceled or
// DeadlineExceeded when the call's context ended while it waited;
// codes.Unavailable for anything else (a closed Gate, too many tenants, a
// failed Lookup). Only an over-limit error's own text reaches the client;
// the others get a fixed message, so that what Lookup failed with (hosts,
// queries, credentials) stays on the server.
func Status(err error) *status.Status {
	var ole *pool.OverLimitError
	switch {
	case errors.As(err, &ole):
		st := status.New(codes.ResourceExhausted, ole.Error())
		if d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(ole.RetryAfter)}); derr == nil {
			return d
		}
		return st
	case errors.Is(err, pool.ErrInvalidTenant):
		return status.New(codes.Unauthenticated, "invalid tenant")
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, "canceled while waiting for a slot")
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, "deadline exceeded while waiting for a slot")
	default:
		return status.New(codes.Unavailable, unavailable)
	}
}

const unavailable = "service unavailable"

// tenantStream is a ServerStream whose context carries the tenant.
type tenantStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *tenantStream) Context() context.Context { return s.ctx }
