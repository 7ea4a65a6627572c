package tenantdb

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Sizing is the sizing check of a Pool: whether the caps of the tenants that
// are busy at the same moment fit in the shared pool's MaxConns.
// Oversubscription is normal, since not every tenant is busy at once; the
// check is for the typical moment.
type Sizing struct {
	// MaxConns is the shared pool's limit, which every tenant shares: with
	// Config.Database, the budget of all the tenant databases together.
	MaxConns int
	// Databases is how many tenant databases have a pool now, with
	// Config.Database; 0 without.
	Databases int
	// MaxReserved is the most connections the reservations in force may
	// keep (Config.MaxReserved with its default); Reserved is what they
	// keep now.
	MaxReserved, Reserved int
	// DefaultPlan is the plan of tenants Lookup places on none.
	DefaultPlan string
	// Plans are the plans in force, sorted by name.
	Plans []PlanSizing

	// TypicalActiveTenants is Config.TypicalActiveTenants (0: not given).
	// TypicalDemand is the connections they may hold at once: that many
	// tenants at the default plan's cap.
	TypicalActiveTenants, TypicalDemand int
	// TypicalSustained is what they hold on average over periods longer
	// than a budget's burst: each at its cap, or at its plan's Budget.Rate
	// when that is lower.
	TypicalSustained float64

	// ActiveTenants counts the tenants holding or waiting for a connection
	// now; ActiveDemand adds up their caps, ActiveSustained their caps or
	// budgets (as TypicalSustained).
	ActiveTenants, ActiveDemand int
	ActiveSustained             float64

	// Warnings say where the configuration fails the check, one sentence
	// each; none when it passes.
	Warnings []string
}

// PlanSizing is one plan as the sizing check sees it.
type PlanSizing struct {
	Name                            string
	MaxConns, ReservedConns, Weight int
	// TenantsToFill is how many busy tenants of the plan take every shared
	// connection between them: MaxConns of the pool over the plan's, rounded
	// up. At 1, one tenant can hold them all.
	TenantsToFill int
	// BudgetRate is the plan's Budget.Rate: the connections one of its
	// tenants holds on average, over periods longer than its Burst; 0
	// without a budget. SustainedTenantsToFill is TenantsToFill over such
	// periods: with each tenant at the lower of its cap and BudgetRate.
	BudgetRate             float64
	SustainedTenantsToFill int
}

// sustained is what one tenant of a plan with cap maxConns and budget
// rate holds on average: its cap, or its budget's rate when lower.
func sustained(maxConns int, rate float64) float64 {
	if rate > 0 && rate < float64(maxConns) {
		return rate
	}
	return float64(maxConns)
}

// Sizing returns the sizing check for the plans in force and the tenants
// busy now. It visits every tracked tenant (in batches, not under one lock
// hold): call it for reports and health pages, not per request.
func (p *Pool) Sizing() Sizing {
	c := p.staticSizing()
	c.Reserved = p.gate.Stat().Reserved
	c.Databases = p.DatabasesStat().Databases
	rates := make(map[string]float64, len(c.Plans))
	for _, pl := range c.Plans {
		rates[pl.Name] = pl.BudgetRate
	}
	for _, t := range p.gate.AppendTenantStat(nil) {
		if t.InUse > 0 || t.Waiting > 0 {
			c.ActiveTenants++
			c.ActiveDemand += t.Limit
			c.ActiveSustained += sustained(t.Limit, rates[t.Plan])
		}
	}
	return c
}

// staticSizing is the part of Sizing that depends on the configuration
// only; New logs its warnings.
func (p *Pool) staticSizing() Sizing {
	plans, def := p.gate.Plans()
	c := Sizing{
		MaxConns:             p.gate.Capacity(),
		MaxReserved:          p.gate.MaxReserved(),
		DefaultPlan:          def,
		TypicalActiveTenants: p.typicalActive,
	}
	reserving := 0
	for name, pl := range plans {
		c.Plans = append(c.Plans, PlanSizing{
			Name: name, MaxConns: pl.MaxConns, ReservedConns: pl.ReservedConns, Weight: max(1, pl.Weight),
			TenantsToFill:          (c.MaxConns + pl.MaxConns - 1) / pl.MaxConns,
			BudgetRate:             pl.Budget.Rate,
			SustainedTenantsToFill: int(math.Ceil(float64(c.MaxConns)/sustained(pl.MaxConns, pl.Budget.Rate) - 1e-9)),
		})
		if pl.ReservedConns > 0 {
			reserving++
		}
	}
	slices.SortFunc(c.Plans, func(a, b PlanSizing) int { return strings.Compare(a.Name, b.Name) })
	for _, pl := range c.Plans {
		if reserving > 1 || reserving == 1 && pl.ReservedConns == 0 {
			continue
		}
		if p.servers != nil { // a tenant holds capacity on its own server only
			for _, name := range p.Servers() {
				if b := p.servers[name].budget.max; pl.MaxConns >= b {
					c.Warnings = append(c.Warnings, fmt.Sprintf(
						"plan %q: one busy tenant on server %q can hold all %d of its connections (its cap is %d) and no other plan reserves any; lower its cap, raise the server's budget or give the other plans ReservedConns",
						pl.Name, name, b, pl.MaxConns))
				}
			}
			continue
		}
		if pl.TenantsToFill == 1 {
			budget := ""
			if pl.SustainedTenantsToFill > 1 {
				budget = fmt.Sprintf(" for as long as its Budget's Burst lasts (%.3g on average)", pl.BudgetRate)
			}
			c.Warnings = append(c.Warnings, fmt.Sprintf(
				"plan %q: one busy tenant can hold all %d shared connections (its cap is %d)%s and no other plan reserves any; lower its cap or give the other plans ReservedConns",
				pl.Name, c.MaxConns, pl.MaxConns, budget))
		}
	}
	if c.TypicalActiveTenants > 0 {
		c.TypicalDemand = c.TypicalActiveTenants * plans[def].MaxConns
		c.TypicalSustained = float64(c.TypicalActiveTenants) * sustained(plans[def].MaxConns, plans[def].Budget.Rate)
		if c.TypicalDemand > c.MaxConns {
			budget := ""
			if c.TypicalSustained < float64(c.TypicalDemand) {
				budget = fmt.Sprintf(" at once (%.3g on average under its Budget)", c.TypicalSustained)
			}
			c.Warnings = append(c.Warnings, fmt.Sprintf(
				"%d typically active tenants at the %q plan's cap of %d may hold %d connections%s, more than MaxConns %d: raise MaxConns (within the server's max_connections) or lower the caps",
				c.TypicalActiveTenants, def, plans[def].MaxConns, c.TypicalDemand, budget, c.MaxConns))
		}
		if p.dbs != nil && c.TypicalActiveTenants > c.MaxConns {
			c.Warnings = append(c.Warnings, fmt.Sprintf(
				"%d typically active tenants, each in its own database, share a budget of %d connections: "+
					"fewer connections than busy databases means a connect on most calls; raise MaxConns (the budget)",
				c.TypicalActiveTenants, c.MaxConns))
		}
	}
	return c
}

// ServerSizing compares what the processes sharing one PostgreSQL server
// may open with what it accepts.
type ServerSizing struct {
	// Server is the server's name with NewServers (CheckServers), or a
	// replica's ("eu1/replica0"), else "".
	Server string
	// MaxConnections is the server's max_connections less
	// superuser_reserved_connections: what ordinary roles may open.
	MaxConnections int
	// Processes is how many processes were said to run this pool;
	// Demand is Processes × MaxConns (× the server's budget, with
	// NewServers, plus one per replica of the server; × a replica's
	// budget plus one: its probe's connections).
	Processes, Demand int
	// BehindPooler reports that the connection reached the server through
	// a pooler or proxy (the server's process ID differs from the one the
	// connection was given at start, which PgBouncer makes up for its
	// clients). The pooler's own limit on server connections (PgBouncer's
	// default_pool_size, a Supavisor pool size) is then what the processes
	// share, and CheckServer cannot see it: give it with WithPoolerLimit.
	BehindPooler bool
	// PoolerLimit is the pooler's limit on server connections for this
	// pool's database and user, as given with WithPoolerLimit; 0 if not
	// given.
	PoolerLimit int
}

// WithPoolerLimit returns s with the pooler's limit on server connections
// (PgBouncer's pool_size or default_pool_size for the pool's database and
// user), which CheckServer cannot read, so that Fits can judge behind a
// pooler.
func (s ServerSizing) WithPoolerLimit(n int) ServerSizing {
	s.PoolerLimit = n
	return s
}

// Known reports whether Fits can judge: false behind a pooler whose limit
// was not given (BehindPooler without PoolerLimit).
func (s ServerSizing) Known() bool { return !s.BehindPooler || s.PoolerLimit > 0 }

// Fits reports whether Demand fits in MaxConnections and, with a
// PoolerLimit, in the pooler's limit too. It is false when it cannot tell
// (behind a pooler without PoolerLimit, see Known): a pool of 97 server
// connections says nothing of a pooler's pool of 24.
func (s ServerSizing) Fits() bool {
	if !s.Known() {
		return false
	}
	if s.PoolerLimit > 0 && s.Demand > s.PoolerLimit {
		return false
	}
	return s.Demand <= s.MaxConnections
}

// CheckServer asks the server for max_connections (on a shared connection,
// counted against no tenant) and compares it with processes × MaxConns, the
// connections that many processes running this pool may open; it also
// reports whether a pooler stands between (BehindPooler), whose limit it
// cannot see: behind one, Fits is false until the limit is given with
// WithPoolerLimit. ctx governs the acquire and the query. Leave room for
// your other clients too. With NewServers it checks the first server by
// name; CheckServers checks each.
func (p *Pool) CheckServer(ctx context.Context, processes int) (ServerSizing, error) {
	if processes < 1 {
		return ServerSizing{}, fmt.Errorf("tenantdb: CheckServer: processes must be at least 1, got %d", processes)
	}
	if p.servers != nil {
		name := p.Servers()[0]
		return p.checkServer(ctx, p.servers[name].admin.pg, name, processes, p.servers[name].budget.max)
	}
	return p.checkServer(ctx, p.pg, "", processes, p.gate.Capacity())
}

// CheckServers is CheckServer for every server of a Pool made by
// NewServers, by name, each against its own budget (plus one connection per
// replica, its probe's), each followed by its replicas (WithReplicas;
// Server "eu1/replica0"), each against its budget plus its probe's
// connection; for a Pool made by New, CheckServer's one. It stops at the first server that fails to answer,
// with what it found so far.
func (p *Pool) CheckServers(ctx context.Context, processes int) ([]ServerSizing, error) {
	if p.servers == nil {
		s, err := p.CheckServer(ctx, processes)
		return []ServerSizing{s}, err
	}
	if processes < 1 {
		return nil, fmt.Errorf("tenantdb: CheckServers: processes must be at least 1, got %d", processes)
	}
	var out []ServerSizing
	for _, name := range p.Servers() {
		d := p.servers[name]
		budget := d.budget.max
		if d.replicas != nil {
			budget += len(d.replicas.list) // each replica's probe reads the primary on a connection of its own
		}
		s, err := p.checkServer(ctx, d.admin.pg, name, processes, budget)
		if err != nil {
			return out, err
		}
		out = append(out, s)
		if d.replicas == nil {
			continue
		}
		for _, r := range d.replicas.list {
			// Each process opens its budget and the probe's connection.
			s, err := p.checkServer(ctx, r.dbs.admin.pg, r.dbs.server, processes, r.dbs.budget.max+1)
			if err != nil {
				return out, err
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// checkServer is CheckServer on pg, whose server may be opened budget
// connections by each of processes.
func (p *Pool) checkServer(ctx context.Context, pg *pgxpool.Pool, name string, processes, budget int) (ServerSizing, error) {
	s := ServerSizing{Server: name, Processes: processes, Demand: processes * budget}
	what := "tenantdb: CheckServer"
	if name != "" {
		what += fmt.Sprintf(" (server %q)", name)
	}
	c, err := p.session.acquire(withoutTenant(ctx), pg)
	if err != nil {
		return s, fmt.Errorf("%s: %w", what, err)
	}
	defer p.session.release(c, nil, nil)
	var pid uint32
	// The simple protocol: one round trip that a transaction pooler cannot
	// split between two server connections (pgx's cached statement is
	// prepared on one and may run on another, SQLSTATE 26000).
	err = c.QueryRow(ctx, "select current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int, "+
		"pg_catalog.pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&s.MaxConnections, &pid)
	if err != nil {
		return s, fmt.Errorf("%s: %w", what, err)
	}
	s.BehindPooler = pid != c.Conn().PgConn().PID()
	return s, nil
}

// warnSizing logs the static sizing warnings at New.
func (p *Pool) warnSizing(cfg Config) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	for _, w := range p.staticSizing().Warnings {
		logger.Warn("tenantdb: sizing: " + w)
	}
}
