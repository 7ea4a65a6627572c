package pool

import "context"

// tenantKey is the one context key that carries a tenant ID through the
// module: tenantdb, poolhttp, the gRPC interceptors and the job runner all
// read and write it, so a tenant set by one is seen by the others.
type tenantKey struct{}

// WithTenant returns a copy of ctx that carries tenantID. It does not
// validate the ID: the Gate that admits a request does (ErrInvalidTenant).
func WithTenant(ctx context.Context, tenantID string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenantID)
}

// TenantFrom returns the tenant ctx carries, and false when it carries none
// (or WithoutTenant hid it).
func TenantFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(tenantKey{}).(string)
	return id, ok
}

// WithoutTenant returns a copy of ctx in which TenantFrom finds no tenant,
// for work done on no tenant's behalf under a tenant's context. It returns
// ctx itself when ctx carries no tenant.
func WithoutTenant(ctx context.Context) context.Context {
	if _, ok := TenantFrom(ctx); !ok {
		return ctx
	}
	return context.WithValue(ctx, tenantKey{}, nil)
}
