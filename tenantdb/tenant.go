package tenantdb

import (
	"context"
	"errors"

	"github.com/tenantdb/tenantdb/pool"
)

// ErrNoTenant is returned when the context carries no tenant, or one that is
// empty, too long or malformed (then it also matches pool.ErrInvalidTenant).
// Such a request is refused rather than served from a shared bucket.
var ErrNoTenant = errors.New("tenantdb: no valid tenant in context")

// WithTenant returns a copy of ctx that carries tenantID. Every Pool call
// made with it is admitted against that tenant's limits. It is
// pool.WithTenant: a tenant set by poolhttp.Middleware or the gRPC
// interceptors is seen here, and the other way round.
func WithTenant(ctx context.Context, tenantID string) context.Context {
	return pool.WithTenant(ctx, tenantID)
}

// TenantFrom returns the tenant ctx carries, and false when it carries none.
// It is pool.TenantFrom.
func TenantFrom(ctx context.Context) (string, bool) {
	return pool.TenantFrom(ctx)
}
