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

// Class is a workload class inside every tenant (Config.Classes, WithClass):
// its cap within the tenant's (MaxConns), its own queue policy (MaxWaiting,
// MaxWait) and its share of the shared pool (MaxShare, MinShare). See
// pool.Class for every field.
type Class = pool.Class

// DefaultClass names the class of calls whose context carries none.
const DefaultClass = pool.DefaultClass

// Unbounded, as Plan.MaxWaiting, asks for an unbounded per-tenant queue.
const Unbounded = pool.Unbounded

// Config configures the tenant bulkheads of a Pool. It is pool.Config, where
// each field is documented; every field is optional, and zero means its
// default. Capacity, the global limit, is the pgxpool.Config's MaxConns: New
// sets it, and rejects any other value.
type Config = pool.Config
