package tenantdb

import (
	"context"
	"fmt"

	"github.com/tenantdb/tenantdb/pool"
)

// ErrNoTenant is returned when the context carries no tenant, or one that is
// empty, too long or malformed (then it also matches pool.ErrInvalidTenant).
// Such a request is refused rather than served from a shared bucket.
// It is pool.ErrNoTenant, the sentinel every adapter shares.
var ErrNoTenant = pool.ErrNoTenant

var errNoTenantInContext = fmt.Errorf("tenantdb: %w in context", ErrNoTenant)

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

// WithClass returns a copy of ctx whose calls are admitted as work of class
// name, one of Config.Classes: at most the class's MaxConns of the tenant's
// connections and its MaxShare of the shared pool, queued by the class's
// policy. A name that is not configured fails each call with
// ErrUnknownClass. It is pool.WithClass, so a class set for a pool.Runner
// job or by poolhttp is seen here.
func WithClass(ctx context.Context, name string) context.Context {
	return pool.WithClass(ctx, name)
}

// ClassFrom returns the class ctx carries, and false when it carries none.
// It is pool.ClassFrom.
func ClassFrom(ctx context.Context) (string, bool) {
	return pool.ClassFrom(ctx)
}
