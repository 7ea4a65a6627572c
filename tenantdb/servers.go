package tenantdb

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// Placement is where a tenant lives with NewServers: a server, one of the
// names given to NewServers, and a database on it ("" for Config.Database's,
// or else the server config's own). See pool.Placement.
type Placement = pool.Placement

// ErrNoPlacement is matched by the error of a call whose tenant has no
// usable placement: Config.Placement failed, panicked, or named a server
// NewServers was not given. The call never runs on another server.
var ErrNoPlacement = pool.ErrNoPlacement

// NewServers creates a Pool whose tenants live on several PostgreSQL
// servers. servers maps each server's name to the template of its
// connections, whose MaxConns is the budget of server connections on it for
// all its databases; Config.Placement (required) says which server, and
// which database there, each tenant lives on. Each server's budget is the
// capacity of its own part of the gate's shared stage, so tenants on one
// server never wait for another's. WithReplicas gives a server read
// replicas, for the calls marked ReadOnly. ctx is used only to create the
// pgxpools, which connect lazily; nothing is started on an error.
func NewServers(ctx context.Context, servers map[string]*pgxpool.Config, cfg Config, opts ...ServersOption) (*Pool, error) {
	if len(servers) == 0 {
		return nil, fmt.Errorf("tenantdb: %w: NewServers needs at least one server", pool.ErrInvalidConfig)
	}
	if cfg.Servers != nil || cfg.Capacity != 0 {
		return nil, fmt.Errorf("tenantdb: %w: NewServers sets Servers and Capacity from each server's MaxConns; leave them zero",
			pool.ErrInvalidConfig)
	}
	if cfg.Placement == nil {
		return nil, fmt.Errorf("tenantdb: %w: NewServers needs Config.Placement, which says where each tenant lives",
			pool.ErrInvalidConfig)
	}
	if cfg.TypicalActiveTenants < 0 {
		return nil, fmt.Errorf("tenantdb: %w: TypicalActiveTenants must not be negative, got %d",
			pool.ErrInvalidConfig, cfg.TypicalActiveTenants)
	}
	var o serversOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkReplicas(&o, servers, cfg); err != nil {
		return nil, err
	}
	names := slices.Sorted(mapKeys(servers))
	cfg.Servers = make(map[string]int, len(servers))
	for _, name := range names {
		pgxCfg := servers[name]
		if pgxCfg == nil {
			return nil, fmt.Errorf("tenantdb: %w: server %q: nil pgxpool.Config: build one with pgxpool.ParseConfig",
				pool.ErrInvalidConfig, name)
		}
		if pgxCfg.ConnConfig == nil {
			panic("config must be created by ParseConfig") // pgxpool.NewWithConfig's own panic
		}
		if err := validateSession(cfg.Session, pgxCfg.ConnConfig.DefaultQueryExecMode); err != nil {
			return nil, fmt.Errorf("tenantdb: server %q: %w", name, err)
		}
		if pgxCfg.MinConns > 0 || pgxCfg.MinIdleConns > 0 {
			return nil, fmt.Errorf("tenantdb: %w: server %q: its pgxpool.Config is the template of every database's "+
				"connections there: MinConns %d and MinIdleConns %d would keep connections open in each; leave them 0",
				pool.ErrInvalidConfig, name, pgxCfg.MinConns, pgxCfg.MinIdleConns)
		}
		cfg.Servers[name] = int(pgxCfg.MaxConns)
	}
	if cfg.MaxDatabases < 0 {
		return nil, fmt.Errorf("tenantdb: %w: MaxDatabases must not be negative, got %d", pool.ErrInvalidConfig, cfg.MaxDatabases)
	}
	gate, err := pool.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("tenantdb: %w", err)
	}
	session := newSessionSetup(cfg)
	idleTTL := idleTTLOf(cfg)
	p := &Pool{gate: gate, session: session, stop: make(chan struct{}), typicalActive: cfg.TypicalActiveTenants,
		servers: make(map[string]*databases, len(servers)), calls: &inflight{}}
	for _, name := range names {
		checks := &serverChecks{} // its replicas' too: they have its catalog
		pgxCfg, trace := session.template(servers[name], cfg, checks)
		dbs := newDatabases(pgxCfg.Copy(), cfg, idleTTL)
		dbs.server = name
		dbs.admin = &database{name: pgxCfg.ConnConfig.Database, d: dbs}
		dbs.wrapTemplate(pgxCfg, dbs.admin)
		pg, err := pgxpool.NewWithConfig(ctx, pgxCfg)
		if err == nil {
			dbs.admin.pg = pg
			if r, ok := o.replicas[name]; ok {
				if dbs.replicas, err = p.newReplicaSet(ctx, name, servers[name], checks, r, cfg, idleTTL); err != nil {
					dbs.close()
				}
			}
		}
		if err != nil {
			for _, s := range p.servers {
				s.close()
			}
			gate.Close()
			return nil, fmt.Errorf("tenantdb: server %q: %w", name, err)
		}
		p.servers[name] = dbs
		if p.pg == nil {
			p.pg, p.cfg, p.acquireTrace = pg, servers[name].Copy(), trace
		}
	}
	p.warnSizing(cfg)
	p.swept.Add(1)
	go p.sweepIdle(max(idleTTL/2, time.Millisecond))
	var probing context.Context
	probing, p.stopProbes = context.WithCancel(context.Background())
	for _, name := range names {
		if set := p.servers[name].replicas; set != nil {
			for _, r := range set.list {
				p.swept.Add(1)
				go p.probe(probing, r)
			}
		}
	}
	return p, nil
}

// use returns the use of the database the admitted permit's work runs in:
// with NewServers, on the server of the permit's placement.
func (p *Pool) use(ctx context.Context, permit pool.Permit) (*dbUse, error) {
	if p.servers == nil {
		return p.dbs.use(ctx)
	}
	at := permit.Placement()
	d := p.servers[at.Server]
	if d == nil { // the gate admits only placements on its servers
		return nil, fmt.Errorf("%w: server %q", ErrNoPlacement, at.Server)
	}
	tenant, _ := TenantFrom(ctx)
	name := at.Database
	switch {
	case name != "":
		if err := checkDatabaseName("Config.Placement", tenant, name); err != nil {
			return nil, err
		}
	case d.name != nil:
		var err error
		if name, err = d.tenantDatabase(tenant); err != nil {
			return nil, err
		}
	}
	if d.replicas != nil && d.replicas.reads(ctx) {
		u, err := d.replicas.useName(name)
		if err == nil || d.replicas.fail {
			return u, err
		}
	}
	return d.useName(name)
}

// Servers returns the names of the servers given to NewServers, sorted;
// nil for a Pool made by New.
func (p *Pool) Servers() []string {
	if p.servers == nil {
		return nil
	}
	return slices.Sorted(mapKeys(p.servers))
}

// ServerPgxpool returns the pgxpool of the named server's own database
// (its config's), for migrations and health checks on no tenant's behalf;
// its connections count in that server's budget. It is nil for a name
// NewServers was not given.
func (p *Pool) ServerPgxpool(name string) *pgxpool.Pool {
	if d := p.servers[name]; d != nil {
		return d.admin.pg
	}
	return nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// ServerStat is one server's budget and use with NewServers.
type ServerStat struct {
	Server string
	// DatabasesStat is the server's budget (its config's MaxConns) and
	// connections: Open never exceeds Budget.
	DatabasesStat
	// InUse and Reserved are the gate's: its tenants' slots held, and the
	// reservations in force on it.
	InUse, Reserved int
	// Down is whether the server is known down: its tenants' calls fail
	// with ErrServerDown without connecting.
	Down bool
	// Replicas are its replicas' (WithReplicas), by index.
	Replicas []ReplicaStat
}

// ServersStat returns one ServerStat per server, by name; nil for a Pool
// made by New.
func (p *Pool) ServersStat() []ServerStat {
	if p.servers == nil {
		return nil
	}
	gate := p.gate.AppendServerStat(nil)
	out := make([]ServerStat, 0, len(gate))
	for _, g := range gate {
		d := p.servers[g.Server]
		s := ServerStat{Server: g.Server, DatabasesStat: d.stat(), InUse: g.InUse, Reserved: g.Reserved,
			Down: d.down.Load() != nil}
		if d.replicas != nil {
			for _, r := range d.replicas.list {
				s.Replicas = append(s.Replicas, r.stat())
			}
		}
		out = append(out, s)
	}
	return out
}
