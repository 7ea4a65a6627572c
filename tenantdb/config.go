package tenantdb

import "github.com/tenantdb/tenantdb/pool"

// Plan is what a class of tenants may use: its cap (MaxConns), what happens
// over it (MaxWaiting, MaxWait), its weight for contended connections and the
// connections it reserves. See pool.Plan for every field.
type Plan = pool.Plan

// Tenant is what a Lookup says about a tenant: its plan and an optional cap
// override. See pool.Tenant.
type Tenant = pool.Tenant

// Adaptive configures adaptive per-tenant limits: each tenant's effective
// limit moves between a floor and its cap, cut when its queries' times
// inflate as its concurrency rises (CPU-bound queries queueing inside
// PostgreSQL) and raised while they do not. See pool.Adaptive for every field.
type Adaptive = pool.Adaptive

// Unbounded, as Plan.MaxWaiting, asks for an unbounded per-tenant queue.
const Unbounded = pool.Unbounded

// Config configures the tenant bulkheads of a Pool: it is pool.Config, whose
// fields document themselves. Zero values mean the documented defaults; every
// field is optional. The global limit, Capacity, is the pgxpool.Config's
// MaxConns: New fills it in, and rejects any other value.
type Config = pool.Config
