// Package pool is the admission core of tenantdb: per-tenant bulkheads in front of
// one shared, limited resource.
//
// A [Gate] hands out permits. Acquiring a permit for a tenant first takes one of
// the tenant's own slots (its plan's MaxConns, an override, or a runtime change),
// and only then one unit of the global capacity. A request waiting for its
// tenant's slot therefore holds no shared capacity: one tenant's backlog cannot
// queue everyone else behind it.
//
// Over its own cap, a request is rejected at once with an [*OverLimitError] or
// waits in a bounded per-tenant queue (Plan.MaxWaiting, Plan.MaxWait). There is no
// unbounded queue unless a plan asks for one by name ([Unbounded]).
//
// When the global capacity is exhausted, requests that already hold a tenant slot
// are served per tenant in weighted round-robin order (Plan.Weight), not first come
// first served, and a plan may reserve capacity for each of its tenants
// (Plan.ReservedConns).
//
// With Config.Adaptive, each tenant's effective limit moves between a floor
// and its cap, driven by its own hold times ([Adaptive]): cut when they inflate
// as its concurrency rises, raised while they do not.
//
// The package knows tenants and permits, not SQL: tenantdb uses it in front of a
// pgxpool, package poolhttp in front of HTTP handlers and outbound calls, and
// [Runner] runs background jobs from per-tenant queues on a Gate. One context
// key carries the tenant through all of them ([WithTenant], [TenantFrom]).
// [Config] is tenantdb.Config too, so it also holds the few settings only
// tenantdb reads ([Session], TypicalActiveTenants, Logger), which a Gate
// ignores. It imports only the standard library.
//
// All work done under the Gate's mutex is O(1) (bounded loops, and one
// amortized: dropping tenants that went busy from the idle list), and user
// callbacks (Lookup, tracers, the ClusterLimiter and its leases) always run
// outside it.
package pool
