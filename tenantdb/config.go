package tenantdb

import (
	"context"
	"log/slog"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

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

// Config configures the tenant bulkheads of a Pool. Zero values mean the
// documented defaults; every field is optional. The global limit is the
// pgxpool.Config's MaxConns.
type Config struct {
	// Plans maps plan names to plans. A plan's MaxConns and ReservedConns
	// must fit in the pgxpool's MaxConns. Default: one plan named "default"
	// with half of MaxConns, rejecting over it.
	Plans map[string]Plan

	// DefaultPlan is the plan of tenants Lookup places on none, and of every
	// tenant when Lookup is nil. Default: the only plan when there is one,
	// else "default".
	DefaultPlan string

	// Lookup tells a tenant's plan and cap override. It is called on a
	// tenant's first request and when its cached answer is older than
	// LookupTTL, with that request's context; its errors fail the request.
	// Default nil: every tenant is on DefaultPlan.
	Lookup func(ctx context.Context, tenantID string) (Tenant, error)

	// LookupTTL is how long a Lookup answer is cached. Default 1 minute.
	LookupTTL time.Duration

	// IdleTTL is how long an idle tenant's state is kept. A background sweep
	// runs every IdleTTL/2. Default 5 minutes.
	IdleTTL time.Duration

	// MaxTenants bounds the tenants tracked at once. Default 100,000.
	MaxTenants int

	// MaxTenantIDLen is the longest accepted tenant ID, in bytes. Default 128.
	MaxTenantIDLen int

	// MaxReserved bounds the reservations in force, so that some capacity
	// stays shared. Default MaxConns/2; it must be below MaxConns.
	MaxReserved int

	// MaxRetryAfter bounds OverLimitError.RetryAfter. Default 30 seconds.
	MaxRetryAfter time.Duration

	// Tracer observes admissions. If it also implements pool.ReleaseTracer it
	// sees releases, and if it implements pgx's tracer interfaces
	// (pgx.QueryTracer and the optional Batch, CopyFrom, Prepare and Connect
	// tracers) New chains it after the tracer already in the pgxpool.Config's
	// ConnConfig.Tracer, so a tracer of your own keeps working. The tracing
	// package provides one. Default nil.
	Tracer pool.AcquireTracer

	// Cluster, when set, keeps each tenant's cap across all the processes
	// that share it (pool/redislimit keeps it in Redis): a request takes a
	// cluster-wide slot after its local tenant slot and before a shared
	// connection. Default nil: caps are per process, so a tenant's effective
	// cap is its plan's MaxConns times the number of processes.
	Cluster pool.ClusterLimiter

	// Session sets per-tenant session state on each connection before a
	// tenant's call uses it (a setting for row-level security policies, a
	// search_path), and restores the defaults for calls without a tenant.
	// Default: none, at no cost. See Session.
	Session Session

	// TypicalActiveTenants is how many tenants you expect to be busy at the
	// same moment. With it, New checks that that many tenants at the default
	// plan's cap fit in MaxConns (the guide's sizing check) and logs a
	// warning if not; Sizing reports it. Default 0: not checked.
	TypicalActiveTenants int

	// Logger receives New's sizing warnings (see Pool.Sizing). Default nil:
	// slog.Default(); slog.New(slog.DiscardHandler) silences them.
	Logger *slog.Logger

	// Adaptive, when Enabled, lowers a tenant's effective limit below its
	// cap while its own queries show that more of them at once only queue
	// inside the database, and raises it back while they do not. Waiting-type
	// work (pg_sleep, lock waits elsewhere, slow remote calls) keeps its cap.
	// A request under the cap is never rejected because of it, only delayed.
	// TenantStat's EffectiveLimit shows where each tenant is. Default off.
	Adaptive Adaptive
}

func (c Config) gateConfig(capacity int) pool.Config {
	return pool.Config{
		Capacity:       capacity,
		Plans:          c.Plans,
		DefaultPlan:    c.DefaultPlan,
		Lookup:         c.Lookup,
		LookupTTL:      c.LookupTTL,
		IdleTTL:        c.IdleTTL,
		MaxTenants:     c.MaxTenants,
		MaxTenantIDLen: c.MaxTenantIDLen,
		MaxReserved:    c.MaxReserved,
		MaxRetryAfter:  c.MaxRetryAfter,
		Tracer:         c.Tracer,
		Cluster:        c.Cluster,
		Adaptive:       c.Adaptive,
	}
}
