package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// Pool is a pgxpool.Pool behind per-tenant bulkheads. It is safe for
// concurrent use. Every method that uses a connection takes the tenant from
// its context (WithTenant) and fails with ErrNoTenant without one.
//
// A shared connection passes from one holder to the next only in a pristine
// session: at every release, in a goroutine of its own and so off the next
// caller's path, everything the holder could leave in its session is
// undone as PostgreSQL's DISCARD ALL would (settings, SET ROLE and SET
// SESSION AUTHORIZATION, temporary tables, cursors, LISTEN, session advisory
// locks), keeping pgx's own prepared statements. A connection whose reset
// fails is closed. See docs/session-state.md.
type Pool struct {
	pg   *pgxpool.Pool
	gate *pool.Gate
	dbs  *databases // nil without Config.Database

	servers map[string]*databases // NewServers's, by server name; else nil
	calls   *inflight             // with NewServers: each tenant's calls in flight, for Move; else nil

	session *sessionSetup

	typicalActive int // Config.TypicalActiveTenants, for Sizing

	cfg          *pgxpool.Config // a copy of the user's, for Config
	acquireTrace *acquireTrace   // the user's pgx AcquireTracer, or nil

	closeOnce  sync.Once
	stop       chan struct{}
	stopProbes context.CancelFunc // with NewServers: ends the replicas' probes; else nil
	swept      sync.WaitGroup     // the idle sweep and the replicas' probes
}

// New creates the shared pgxpool from pgxCfg and puts tenant bulkheads in
// front of it, limited globally by pgxCfg.MaxConns. A Config that cannot work
// with that limit (a plan's cap or reservation above it, an unknown default
// plan, negative numbers) is an error wrapping pool.ErrInvalidConfig, and
// nothing is started. ctx is used only to create the pgxpool, as in
// pgxpool.NewWithConfig; it connects lazily unless pgxCfg.MinConns is set.
func New(ctx context.Context, pgxCfg *pgxpool.Config, cfg Config) (*Pool, error) {
	if pgxCfg == nil {
		return nil, errors.New("tenantdb: nil pgxpool.Config: build one with pgxpool.ParseConfig")
	}
	if pgxCfg.ConnConfig == nil {
		panic("config must be created by ParseConfig") // pgxpool.NewWithConfig's own panic
	}
	if err := validateSession(cfg.Session, pgxCfg.ConnConfig.DefaultQueryExecMode); err != nil {
		return nil, fmt.Errorf("tenantdb: %w", err)
	}
	if cfg.TypicalActiveTenants < 0 {
		return nil, fmt.Errorf("tenantdb: %w: TypicalActiveTenants must not be negative, got %d",
			pool.ErrInvalidConfig, cfg.TypicalActiveTenants)
	}
	if cfg.Capacity != 0 && cfg.Capacity != int(pgxCfg.MaxConns) {
		return nil, fmt.Errorf("tenantdb: %w: Capacity is the pgxpool.Config's MaxConns %d; leave it 0, got %d",
			pool.ErrInvalidConfig, pgxCfg.MaxConns, cfg.Capacity)
	}
	if err := validateDatabases(cfg, pgxCfg); err != nil {
		return nil, err
	}
	cfg.Capacity = int(pgxCfg.MaxConns)
	gate, err := pool.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("tenantdb: %w (pgxpool MaxConns %d)", err, pgxCfg.MaxConns)
	}
	userCfg := pgxCfg.Copy()
	session := newSessionSetup(cfg)
	pgxCfg, acquireTrace := session.template(pgxCfg, cfg, &serverChecks{})
	idleTTL := idleTTLOf(cfg)
	var dbs *databases
	if cfg.Database != nil {
		dbs = newDatabases(pgxCfg.Copy(), cfg, idleTTL)
		dbs.admin = &database{name: pgxCfg.ConnConfig.Database, d: dbs}
		dbs.wrapTemplate(pgxCfg, dbs.admin)
	}
	pg, err := pgxpool.NewWithConfig(ctx, pgxCfg)
	if err != nil {
		gate.Close()
		return nil, fmt.Errorf("tenantdb: %w", err)
	}
	if dbs != nil {
		dbs.admin.pg = pg
		if cfg.Affinity >= 0 { // on by default with Database
			session.waiting = func(tenant string) bool { return gate.Waiting(tenant) > 0 }
		}
	} else {
		session.idle = func() bool { return pg.Stat().IdleConns() > 0 }
	}
	p := &Pool{pg: pg, gate: gate, dbs: dbs, session: session, stop: make(chan struct{}), typicalActive: cfg.TypicalActiveTenants,
		cfg: userCfg, acquireTrace: acquireTrace}
	p.warnSizing(cfg)
	p.swept.Add(1)
	go p.sweepIdle(max(idleTTL/2, time.Millisecond))
	return p, nil
}

// newSessionSetup returns the session setup of cfg, logging to its Logger.
func newSessionSetup(cfg Config) *sessionSetup {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &sessionSetup{cfg: cfg.Session, logger: logger}
}

// template returns a copy of pgxCfg with tenantdb's tracers and session
// hooks installed, its connections checked with server's checks, and the
// user's AcquireTracer's trace (nil without one).
func (s *sessionSetup) template(pgxCfg *pgxpool.Config, cfg Config, server *serverChecks) (*pgxpool.Config, *acquireTrace) {
	pgxCfg = pgxCfg.Copy()
	acquireTrace := hookAcquireTracer(pgxCfg.ConnConfig)
	if qt, ok := cfg.Tracer.(pgx.QueryTracer); ok {
		if own := pgxCfg.ConnConfig.Tracer; own != nil {
			pgxCfg.ConnConfig.Tracer = chainTracers(own, qt)
		} else {
			pgxCfg.ConnConfig.Tracer = qt
		}
	}
	s.install(pgxCfg, server)
	return pgxCfg, acquireTrace
}

// idleTTLOf is cfg.IdleTTL with its default.
func idleTTLOf(cfg Config) time.Duration {
	if cfg.IdleTTL <= 0 {
		return 5 * time.Minute
	}
	return cfg.IdleTTL
}

// sweepIdle evicts idle tenants in the background, so that their state goes
// even when no further requests come to sweep it lazily.
func (p *Pool) sweepIdle(every time.Duration) {
	defer p.swept.Done()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
			p.gate.EvictIdle()
			if p.dbs != nil {
				p.dbs.evictIdle()
			}
			for _, s := range p.servers {
				s.evictIdle()
				if s.replicas != nil {
					for _, r := range s.replicas.list {
						r.dbs.evictIdle()
					}
				}
			}
		}
	}
}

// Close fails waiting requests with ErrClosed, stops the idle sweep and closes
// the pgxpool, which waits for acquired connections to be released. It is
// safe to call more than once.
func (p *Pool) Close() {
	p.closeOnce.Do(func() {
		p.gate.Close()
		close(p.stop)
		if p.stopProbes != nil {
			p.stopProbes()
		}
		p.swept.Wait()
		if p.dbs != nil {
			p.dbs.close() // closes p.pg too
			return
		}
		if p.servers != nil {
			for _, s := range p.servers {
				s.close() // closes p.pg too
			}
			return
		}
		p.pg.Close()
	})
}

// Ping checks that the server answers. With a tenant in ctx it is that
// tenant's call, taking one of its slots like every other. Without one it is
// a health check: it takes no tenant slot (so no tenant's cap can reject it)
// but a connection of the shared pool, within MaxConns like everything else.
// A tenant that is in ctx but empty or malformed still fails with
// ErrNoTenant. ctx governs the waits and the ping.
func (p *Pool) Ping(ctx context.Context) error {
	if _, ok := TenantFrom(ctx); !ok {
		select {
		case <-p.stop:
			return ErrClosed
		default:
		}
		return p.ping(ctx)
	}
	if p.dbs != nil || p.servers != nil {
		var h held
		ctx, err := p.hold(ctx, &h)
		if err != nil {
			return err
		}
		err = h.conn.Ping(ctx)
		h.release(&err)
		return err
	}
	ctx, end := p.acquireTrace.start(ctx, p.pg) // pgxpool's acquire in Ping ends it
	permit, err := p.admit(ctx)
	if err != nil {
		end(nil, err)
		return err
	}
	defer permit.Release()
	err = p.ping(ctx)
	end(nil, err) // only if pgxpool's acquire did not
	return err
}

// ping is pgxpool's Ping, with tenantdb's release (see release).
func (p *Pool) ping(ctx context.Context) error {
	c, err := p.session.acquire(ctx, p.pg)
	if err != nil {
		return err
	}
	err = c.Ping(ctx)
	p.session.release(c, nil, nil)
	return err
}

// AcquireAllIdle acquires every idle connection of the shared pool at once,
// for maintenance and keep-alive work, as pgxpool.Pool.AcquireAllIdle. The
// connections are taken on no tenant's behalf: any tenant in ctx is ignored,
// they hold no tenant slot, and with Config.Session their state is the
// defaults. The tenant gate does not count them, so while they are held,
// admitted calls wait for pgxpool's connections (within their contexts):
// release each soon. ctx is passed to the session setup, if any.
func (p *Pool) AcquireAllIdle(ctx context.Context) []Conn {
	idle := p.pg.AcquireAllIdle(withoutTenant(ctx))
	conns := make([]Conn, len(idle))
	for i, c := range idle {
		// The zero Permit's Release does nothing; the runner marks nothing
		// dirty that prepare did not mark already (no tenant).
		st := stateOf(c.Conn().PgConn())
		st.setup = p.session
		conns[i] = Conn{h: held{conn: c, run: runner{conn: c.Conn(), st: st}}, ref: newLiveRef(&st.life)}
	}
	return conns
}

// Pgxpool returns the shared pgxpool. Calls made on it directly bypass the
// tenant bulkheads (they still count against MaxConns): it is for health
// checks, migrations and what tenantdb does not wrap. With Config.Database
// it is the pool of the pgxpool.Config's own database, whose connections
// count in the budget with every tenant database's.
func (p *Pool) Pgxpool() *pgxpool.Pool { return p.pg }

// Gate returns the Pool's admission gate: change limits at runtime with its
// SetPlan, SetTenantLimit and InvalidateTenant, read every tenant's stats with
// AppendTenantStat, or pass it to what takes a *pool.Gate (tracing's
// ObserveGate). Not to a pool.Runner whose jobs use this Pool: a job's permit
// would hold the slot its own statements need, so they fail with
// pool.ErrRunnerOwnGate; give the Runner a Gate of its own. Close the Pool,
// not the Gate.
func (p *Pool) Gate() *pool.Gate { return p.gate }

// Config returns a copy of the pgxpool.Config the Pool was created from, as
// pgxpool.Pool.Config does: without tenantdb's hooks and tracers, so that a
// pool created from it does not stack them.
func (p *Pool) Config() *pgxpool.Config { return p.cfg.Copy() }

// Reset closes every connection in the shared pool, as pgxpool.Pool.Reset;
// with Config.Database, in every database's.
func (p *Pool) Reset() {
	if p.dbs != nil {
		p.dbs.each(func(db *database) { db.pg.Reset() })
	}
	for _, s := range p.servers {
		s.each(func(db *database) { db.pg.Reset() })
		s.admin.pg.Reset()
		if s.replicas != nil {
			for _, r := range s.replicas.list {
				r.dbs.each(func(db *database) { db.pg.Reset() })
				r.dbs.admin.pg.Reset()
			}
		}
	}
	p.pg.Reset()
}

// Stat is the shared pgxpool's statistics plus the tenant gate's totals.
// With Config.Database the pgxpool's are the template database's
// (Pool.Pgxpool); DatabasesStat and AppendDatabaseStat have the tenant
// databases'.
type Stat struct {
	*pgxpool.Stat
	// Tenants are the gate's totals: connections in use and waiting across
	// tenants, tenants tracked, admissions by outcome.
	Tenants pool.Stat
}

// Stat returns a snapshot of the pool and the tenant gate.
func (p *Pool) Stat() *Stat { return &Stat{Stat: p.pg.Stat(), Tenants: p.gate.Stat()} }

// TenantStat returns a snapshot of tenantID: its limit, connections in use
// and waiting, admissions by outcome, and wait and hold times. A tenant that
// is not tracked (never seen, or evicted as idle) has zero values.
func (p *Pool) TenantStat(tenantID string) pool.TenantStat {
	s, _ := p.gate.TenantStat(tenantID)
	return s
}
