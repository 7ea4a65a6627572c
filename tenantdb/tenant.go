package tenantdb

import (
	"context"
	"errors"
)

// ErrNoTenant is returned when the context carries no tenant, or one that is
// empty, too long or malformed (then it also matches pool.ErrInvalidTenant).
// Such a request is refused rather than served from a shared bucket.
var ErrNoTenant = errors.New("tenantdb: no valid tenant in context")

type tenantKey struct{}

// WithTenant returns a copy of ctx that carries tenantID. Every Pool call
// made with it is admitted against that tenant's limits.
func WithTenant(ctx context.Context, tenantID string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenantID)
}

// TenantFrom returns the tenant ctx carries, and false when it carries none.
func TenantFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(tenantKey{}).(string)
	return id, ok
}
