package pool

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Unbounded, as Plan.MaxWaiting, asks for an unbounded per-tenant queue. It is
// never the default: a queue that can grow without limit turns one tenant's
// burst into memory growth and timeouts, which is what bulkheads exist to stop.
const Unbounded = -1

// MaxWeight is the largest Plan.Weight.
const MaxWeight = 1000

// Plan is what a class of tenants may use. The zero value of every field but
// MaxConns means its documented default.
type Plan struct {
	// MaxConns is how many permits one tenant on this plan may hold at once.
	// Required: from 1 to Config.Capacity.
	MaxConns int

	// MaxWaiting is how many of one tenant's requests may wait once the tenant
	// holds MaxConns permits (or is already waiting for that many). Past it,
	// requests are rejected at once with an *OverLimitError. Default 0: every
	// request over the cap is rejected. Unbounded (-1) removes the bound.
	MaxWaiting int

	// MaxWait is how long a request may wait for a slot under the tenant's own
	// cap before it is rejected with an *OverLimitError. Default 0: only the
	// caller's context bounds the wait. With Config.Cluster it bounds the wait
	// for the local and the cluster-wide slot together, counted from arrival.
	// It does not bound the wait for global capacity, which only the context
	// bounds.
	MaxWait time.Duration

	// Weight is the plan's share of contended global capacity: when requests of
	// several tenants wait for it, a tenant of weight 2 is served twice as often
	// as one of weight 1. Default 0 means 1; at most MaxWeight.
	Weight int

	// ReservedConns is global capacity kept for each tenant on this plan: while
	// the tenant holds fewer permits than this, other tenants cannot take the
	// last free units it needs. A reservation is in force from the tenant's
	// first request until it is evicted as idle, and only while the
	// reservations in force sum to at most Config.MaxReserved; a tenant that
	// does not fit runs without one until room frees (see Stat.ReservationsDenied).
	// Default 0. At most MaxConns and Config.MaxReserved.
	ReservedConns int

	// ClassConns sets, for this plan's tenants, the cap of the classes it
	// names (Config.Classes) in place of the class's MaxConns, so that a
	// class fits plans of every size. Each from 1 to MaxConns. Default nil:
	// every class's own MaxConns, which must then fit in MaxConns.
	ClassConns map[string]int

	// StatementTimeout bounds each statement of the plan's tenants on the
	// server (PostgreSQL's statement_timeout), set with the tenant's values
	// at no extra round trip; tenantdb fails a statement that exceeds it
	// with ErrStatementTimeout. Default 0: the server's own setting.
	StatementTimeout time.Duration

	// Budget, when its Rate is positive, gives each of the plan's tenants
	// a share of connection-time (see Budget). Default: none, only the cap.
	Budget Budget

	// IdleInTransactionTimeout ends a transaction (a tenantdb Tx, or a
	// Conn inside one) whose holder has sent nothing for this long: it is
	// rolled back, its connection and slot are returned, and its later uses
	// fail. Unlike PostgreSQL's idle_in_transaction_session_timeout it costs
	// no server session. Default 0: never.
	IdleInTransactionTimeout time.Duration

	// MaxHold ends a tenantdb Tx or Conn held longer than this, as
	// IdleInTransactionTimeout does; a statement running then ends first
	// (StatementTimeout bounds it). Default 0: never.
	MaxHold time.Duration
}

// Tenant is what a Lookup says about one tenant.
type Tenant struct {
	// Plan names one of Config.Plans. Empty means Config.DefaultPlan.
	Plan string
	// MaxConns, when positive, overrides the plan's MaxConns for this tenant.
	// It must not exceed Config.Capacity. 0 means the plan's.
	MaxConns int
	// StatementTimeout, when positive, overrides the plan's
	// StatementTimeout for this tenant. 0 means the plan's.
	StatementTimeout time.Duration
	// IdleInTransactionTimeout and MaxHold, when positive, override the
	// plan's for this tenant. 0 means the plan's.
	IdleInTransactionTimeout, MaxHold time.Duration
}

// Config configures a Gate, and a tenantdb.Pool, whose tenantdb.Config is
// this type. Zero values mean the documented defaults; only Capacity is
// required by New, and tenantdb.New fills it in. Session,
// TypicalActiveTenants and Logger are read by tenantdb.New only.
type Config struct {
	// Capacity is the global number of permits, shared by all tenants.
	// Required, positive. tenantdb.New sets it to the pgxpool.Config's
	// MaxConns; leave it 0 there.
	Capacity int

	// Plans maps plan names to plans. A plan's MaxConns and ReservedConns
	// must fit in Capacity. Default: one plan named "default" with MaxConns
	// Capacity/2 (at least 1), rejecting over it.
	Plans map[string]Plan

	// DefaultPlan is the plan of tenants that Lookup places on no plan, and of
	// every tenant when Lookup is nil. It must name one of Plans. Default: the
	// only plan when Plans has one, else "default".
	DefaultPlan string

	// Lookup, when set, tells a tenant's plan and override. It is called
	// outside any lock on a tenant's first request and again when its answer
	// is older than LookupTTL; its errors are returned to the caller, never
	// guessed around. The ctx it receives is the acquiring request's. Default
	// nil: every tenant is on DefaultPlan.
	Lookup func(ctx context.Context, tenantID string) (Tenant, error)

	// LookupTTL is how long a Lookup answer is used. Default 1 minute.
	LookupTTL time.Duration

	// LookupErrorTTL is how long a tenant's Lookup failure (its error, an
	// unknown plan, an override out of range) is returned to that tenant's
	// requests without asking Lookup again, so that a flood of requests for
	// an unknown tenant reaches the store behind Lookup once per
	// LookupErrorTTL, not once per request. Each request gets the same error.
	// A request whose own context ended during Lookup caches nothing; other
	// tenants are not affected; InvalidateTenant forgets a failure. Default
	// 1 second.
	LookupErrorTTL time.Duration

	// IdleTTL is how long a tenant with nothing in use or waiting is tracked
	// before its state (counters, cached Lookup answer, reservation) is
	// removed. Removal happens lazily on later requests and on EvictIdle
	// (which a tenantdb.Pool runs every IdleTTL/2), so a tenant is removed no
	// sooner than IdleTTL after it went idle. Default 5 minutes.
	IdleTTL time.Duration

	// MaxTenants bounds how many tenants are tracked at once, so that a flood
	// of distinct tenant IDs cannot grow memory without limit. At the bound, the
	// longest-idle tenant is evicted early to make room; when every tracked
	// tenant is busy, new tenants get ErrTooManyTenants. Default 100,000.
	MaxTenants int

	// MaxTenantIDLen is the longest accepted tenant ID in bytes. Default 128.
	MaxTenantIDLen int

	// MaxReserved bounds the sum of reservations in force, so that some
	// capacity always stays shared. Default Capacity/2. Below Capacity.
	MaxReserved int

	// MaxRetryAfter bounds OverLimitError.RetryAfter. Default 30 seconds.
	MaxRetryAfter time.Duration

	// Tracer observes admissions; if it also implements ReleaseTracer,
	// releases. With tenantdb, if it implements pgx's tracer interfaces
	// (pgx.QueryTracer and the optional Batch, CopyFrom, Prepare and Connect
	// tracers), tenantdb.New chains it after the tracer already in the
	// pgxpool.Config's ConnConfig.Tracer, so a tracer of your own keeps
	// working; package tracing provides one. Default nil.
	Tracer AcquireTracer

	// Cluster, when set, keeps each tenant's cap across the processes that
	// share it (pool/redislimit keeps it in Redis): every request also takes
	// a cluster-wide slot from it, after its local tenant slot and before
	// global capacity. Default nil: caps are per process, so a tenant's
	// effective cap is its plan's MaxConns times the number of processes.
	Cluster ClusterLimiter

	// Classes are the workload classes inside every tenant (see Class):
	// work whose context names one (WithClass) holds at most the class's
	// share of its tenant's cap and of Capacity, and queues by the class's
	// policy; work that names none is the default class, which keeps the
	// plan's policy and goes first when capacity is contended. At most
	// MaxClasses; names of 1 to 32 letters, digits, '_', '-' or '.', other
	// than DefaultClass. Default nil: all work is of the default class.
	Classes map[string]Class

	// Adaptive, when Enabled, moves each tenant's effective limit between a
	// floor and its cap by what its own hold times show (see Adaptive): it
	// lowers the limit while more of the tenant's queries at once only queue
	// inside the database, and raises it back while they do not, so
	// waiting-type work (pg_sleep, lock waits elsewhere, slow remote calls)
	// keeps its cap. A request under the cap is never rejected because of
	// it, only delayed. TenantStat.EffectiveLimit shows where each tenant is.
	// With Classes, the adaptive limit bounds the default class only, fed by
	// that class's hold times alone; the other classes keep their caps.
	// Default off: the effective limit is the cap.
	Adaptive Adaptive

	// Session sets per-tenant session state on each connection before a
	// tenant's call uses it (a setting for row-level security policies, a
	// search_path), and restores the defaults for calls without a tenant.
	// Default: none, at no cost. Read by tenantdb.New; see tenantdb.Session.
	Session Session

	// Database, when set, names the database each tenant's statements run
	// in, on the server of the pgxpool.Config given to tenantdb.New. That
	// config is then the template of every database's connections, and its
	// MaxConns the budget of server connections for all databases together.
	// Its errors and panics, and a name that is empty, longer than 63 bytes
	// or holds a NUL byte, fail the tenant's call. Default nil: one
	// database, the config's own. Read by tenantdb.New; see tenantdb.Pool.
	Database func(tenantID string) (string, error)

	// MaxDatabases bounds how many databases a tenantdb.Pool with Database
	// keeps a pool of connections for. At the bound, the longest-unused one
	// with no call in flight is dropped, with its idle connections. Default
	// 10,000.
	MaxDatabases int

	// Servers, when set, splits the shared capacity by server: each named
	// server has its own capacity, and a tenant's requests take capacity on
	// the server Placement puts it on only, so tenants on one server never
	// wait for another's. Reservations (MaxReserved, per server), class
	// shares and weights hold on each server; a plan's caps must fit in the
	// smallest. Capacity is then their sum: leave it 0. tenantdb.NewServers
	// sets it from each server's MaxConns. Default nil: one server.
	Servers map[string]int

	// Placement, required with Servers, says which server (and database)
	// each tenant runs on. It is asked with Lookup, outside any lock, and its
	// answer is used and refreshed as Lookup's (LookupTTL); its errors,
	// panics and unknown servers fail the tenant's requests with
	// ErrNoPlacement, cached for LookupErrorTTL, never a default server. A
	// new answer takes effect once the tenant holds no capacity: its work in
	// flight stays where it was admitted.
	Placement func(ctx context.Context, tenantID string) (Placement, error)

	// Affinity is how many permits in a row the capacity a released permit
	// returns may go to its own tenant's next request waiting in the same
	// class, ahead of the fair order, while other tenants wait: what it
	// stands for is warm for that tenant (with Database, a connection open
	// to the tenant's database, which another tenant's database can have
	// only by a close and a connect). Then the next release goes in the
	// fair order, so the request whose turn it is waits for at most
	// Affinity such grants. It changes the order, not the shares: a tenant
	// runs at most Affinity grants ahead of its turns, and each of its next
	// turns pays one back. Reserved lines and a class below its MinShare
	// still go first. Default 0: 8 with Database, none without. Negative:
	// none, the fair order only.
	Affinity int

	// TypicalActiveTenants is how many tenants you expect to be busy at the
	// same moment. With it, tenantdb.New checks that that many tenants at
	// the default plan's cap fit in Capacity and logs a warning if not;
	// tenantdb.Pool.Sizing reports it. Default 0: not checked.
	TypicalActiveTenants int

	// Logger receives tenantdb.New's sizing warnings (see
	// tenantdb.Pool.Sizing). Default nil: slog.Default();
	// slog.New(slog.DiscardHandler) silences them.
	Logger *slog.Logger
}

const (
	defaultPlanName       = "default"
	defaultLookupTTL      = time.Minute
	defaultLookupErrorTTL = time.Second
	defaultIdleTTL        = 5 * time.Minute
	defaultMaxTenants     = 100_000
	defaultMaxTenantIDLen = 128
	defaultMaxRetryAfter  = 30 * time.Second
	// defaultDatabaseAffinity is Affinity's default with Database.
	defaultDatabaseAffinity = 8
	// unknownHold stands in for a tenant's hold time before any was observed.
	unknownHold = time.Second
)

// withDefaults returns a copy of c with defaults filled in, or an error
// wrapping ErrInvalidConfig when the configuration cannot work.
func (c Config) withDefaults() (_ Config, err error) {
	if err := c.validateServers(); err != nil {
		return c, err
	}
	if c.Capacity <= 0 {
		return c, fmt.Errorf("%w: Capacity must be positive, got %d", ErrInvalidConfig, c.Capacity)
	}
	capacity := c.tenantCapacity()
	if c.MaxReserved == 0 {
		c.MaxReserved = capacity / 2
	}
	if c.MaxReserved < 0 || c.MaxReserved >= capacity && c.MaxReserved > 0 {
		return c, fmt.Errorf("%w: MaxReserved %d must be from 0 to below Capacity %d (the smallest server's with Servers), "+
			"so that some capacity stays shared", ErrInvalidConfig, c.MaxReserved, capacity)
	}
	if len(c.Plans) == 0 {
		c.Plans = map[string]Plan{defaultPlanName: {MaxConns: max(1, capacity/2)}}
	}
	if c.DefaultPlan == "" {
		if len(c.Plans) == 1 {
			for name := range c.Plans {
				c.DefaultPlan = name
			}
		} else {
			c.DefaultPlan = defaultPlanName
		}
	}
	if _, ok := c.Plans[c.DefaultPlan]; !ok {
		return c, fmt.Errorf("%w: DefaultPlan %q is not one of Plans", ErrInvalidConfig, c.DefaultPlan)
	}
	for name, p := range c.Plans {
		if err := p.validate(name, capacity, c.MaxReserved); err != nil {
			return c, err
		}
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"LookupTTL", &c.LookupTTL, defaultLookupTTL},
		{"LookupErrorTTL", &c.LookupErrorTTL, defaultLookupErrorTTL},
		{"IdleTTL", &c.IdleTTL, defaultIdleTTL},
		{"MaxRetryAfter", &c.MaxRetryAfter, defaultMaxRetryAfter},
	} {
		if *d.v < 0 {
			return c, fmt.Errorf("%w: %s must not be negative, got %v", ErrInvalidConfig, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.MaxTenants < 0 || c.MaxTenantIDLen < 0 {
		return c, fmt.Errorf("%w: MaxTenants and MaxTenantIDLen must not be negative", ErrInvalidConfig)
	}
	if c.Adaptive, err = c.Adaptive.withDefaults(); err != nil {
		return c, err
	}
	if c.Affinity == 0 && c.Database != nil {
		c.Affinity = defaultDatabaseAffinity
	}
	if c.MaxTenants == 0 {
		c.MaxTenants = defaultMaxTenants
	}
	if c.MaxTenantIDLen == 0 {
		c.MaxTenantIDLen = defaultMaxTenantIDLen
	}
	return c, nil
}

func (p Plan) validate(name string, capacity, maxReserved int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: plan %q: %s", ErrInvalidConfig, name, fmt.Sprintf(format, args...))
	}
	switch {
	case name == "":
		return fmt.Errorf("%w: a plan has an empty name", ErrInvalidConfig)
	case p.MaxConns <= 0:
		return bad("MaxConns must be positive, got %d", p.MaxConns)
	case p.MaxConns > capacity:
		return bad("MaxConns %d is above the capacity %d", p.MaxConns, capacity)
	case p.MaxWaiting < Unbounded:
		return bad("MaxWaiting must be 0 or more, or Unbounded, got %d", p.MaxWaiting)
	case p.MaxWait < 0:
		return bad("MaxWait must not be negative, got %v", p.MaxWait)
	case p.Weight < 0 || p.Weight > MaxWeight:
		return bad("Weight must be from 0 to %d, got %d", MaxWeight, p.Weight)
	case p.ReservedConns < 0:
		return bad("ReservedConns must not be negative, got %d", p.ReservedConns)
	case p.ReservedConns > p.MaxConns:
		return bad("ReservedConns %d is above its MaxConns %d", p.ReservedConns, p.MaxConns)
	case p.Budget.validate() != nil:
		return bad("%v", p.Budget.validate())
	case p.StatementTimeout < 0:
		return bad("StatementTimeout must not be negative, got %v", p.StatementTimeout)
	case p.IdleInTransactionTimeout < 0:
		return bad("IdleInTransactionTimeout must not be negative, got %v", p.IdleInTransactionTimeout)
	case p.MaxHold < 0:
		return bad("MaxHold must not be negative, got %v", p.MaxHold)
	case p.ReservedConns > maxReserved:
		return bad("ReservedConns %d is above MaxReserved %d (capacity %d)", p.ReservedConns, maxReserved, capacity)
	}
	return nil
}
