// Package tenantgrpc puts per-tenant bulkheads in front of gRPC handlers, on
// the same admission core as tenantdb and poolhttp: a [pool.Gate] with its
// own plans and capacity.
//
// [UnaryServerInterceptor] and [StreamServerInterceptor] admit every call for
// the tenant a [TenantFunc] reads from the incoming metadata, hold one of the
// tenant's slots for the handler's whole run (a stream's whole life), and put
// the tenant in the handler's context under pool's key, where tenantdb finds
// it. A tenant over its cap gets codes.ResourceExhausted with an
// errdetails.RetryInfo; a call without a valid tenant, codes.Unauthenticated.
//
// The package lives outside pool so that pool stays standard-library only,
// and nothing in tenantdb imports it: a program using only the pgx API does
// not link gRPC.
package tenantgrpc
