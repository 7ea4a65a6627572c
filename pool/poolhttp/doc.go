// Package poolhttp puts per-tenant bulkheads in front of HTTP work, on the
// same admission core as tenantdb: a [pool.Gate] with its own plans and
// capacity.
//
// [Middleware] admits incoming requests: each holds one of its tenant's slots
// for the handler's whole run, and a tenant over its cap gets 429 Too Many
// Requests with Retry-After at once, or waits in its plan's bounded queue.
// [Transport] admits outbound calls (a per-tenant share of a third-party API
// quota): each holds a slot until its response body reaches EOF or is closed.
//
// Both carry the tenant in the context key of package pool (pool.WithTenant),
// which tenantdb reads too: a handler behind Middleware calls tenantdb and
// an http.Client on Transport with r.Context() and nothing else.
//
// The package imports only pool and the standard library.
package poolhttp
