package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// Replicas are one server's read replicas (physical streaming standbys)
// for NewServers, given with WithReplicas. A call whose context is marked
// with ReadOnly runs on one of them, under the same tenant slot as every
// other call of its tenant; one whose replicas are all down or behind
// MaxLag runs on the primary, or fails, as Unavailable says.
type Replicas struct {
	// Configs are the templates of each replica's connections, as the
	// server's own config is of the primary's; a replica's MaxConns is its
	// own budget of connections, for all its databases. Required.
	Configs []*pgxpool.Config
	// MaxLag is how far behind the primary a replica may be and still
	// serve reads: it must have replayed everything the primary had
	// written MaxLag ago. Default 5s.
	MaxLag time.Duration
	// ProbeEvery is how often a background probe compares each replica's
	// replayed WAL position with the primary's; it must be below MaxLag,
	// which bounds each probe's queries too. Default MaxLag/5. Each
	// replica's probe has a connection of its own to the replica and one to
	// the primary, beyond their budgets, so that it never waits for calls.
	ProbeEvery time.Duration
	// Unavailable is what a read-only call does when none of the server's
	// replicas is usable: ReadPrimary (the default) runs it on the primary,
	// FailRead fails it with ErrReplicaUnavailable.
	Unavailable ReplicaFallback
	// Classes names workload classes (Config.Classes, WithClass) whose
	// calls are read-only, as if marked with ReadOnly. Default none.
	Classes []string
}

// ReplicaFallback is what a read-only call does when no replica of its
// server is usable (Replicas.Unavailable).
type ReplicaFallback int

const (
	// ReadPrimary runs the call on the primary.
	ReadPrimary ReplicaFallback = iota
	// FailRead fails the call with ErrReplicaUnavailable, at once.
	FailRead
)

// ErrReplicaUnavailable is matched by the error of a read-only call whose
// server has replicas, none of them usable (down, behind Replicas.MaxLag, or
// not probed yet), with Replicas.Unavailable FailRead. The call ran nowhere.
var ErrReplicaUnavailable = errors.New("tenantdb: no replica available")

// defaultMaxLag is Replicas.MaxLag's default.
const defaultMaxLag = 5 * time.Second

// readOnlyKey marks a read-only call's context.
type readOnlyKey struct{}

// ReadOnly returns ctx marked read-only: with NewServers, the calls made
// with it run on a replica of their tenant's server (WithReplicas), if it
// has a usable one; without replicas the mark does nothing. It is a routing mark, not a guard: PostgreSQL refuses
// writes on a replica, but not on the primary a read falls back to. A
// transaction begun with pgx.TxOptions{AccessMode: pgx.ReadOnly} is routed
// the same way.
func ReadOnly(ctx context.Context) context.Context {
	return context.WithValue(ctx, readOnlyKey{}, true)
}

// IsReadOnly reports whether ctx is marked with ReadOnly.
func IsReadOnly(ctx context.Context) bool {
	v, _ := ctx.Value(readOnlyKey{}).(bool)
	return v
}

// ServersOption configures NewServers beyond its Config.
type ServersOption func(*serversOptions)

type serversOptions struct {
	replicas map[string]Replicas
}

// WithReplicas gives server its read replicas.
func WithReplicas(server string, r Replicas) ServersOption {
	return func(o *serversOptions) {
		if o.replicas == nil {
			o.replicas = make(map[string]Replicas)
		}
		o.replicas[server] = r
	}
}

// replicaSet is one server's replicas.
type replicaSet struct {
	list   []*replica
	fail   bool          // Unavailable is FailRead
	maxLag time.Duration // Replicas.MaxLag
	every  time.Duration // Replicas.ProbeEvery
	turn   atomic.Uint32 // the replica the next read tries first

	classes map[string]bool // Replicas.Classes; nil without
}

// reads reports whether the call of ctx is read-only: marked with ReadOnly,
// or of one of Replicas.Classes.
func (s *replicaSet) reads(ctx context.Context) bool {
	if IsReadOnly(ctx) {
		return true
	}
	if s.classes == nil {
		return false
	}
	class, _ := pool.ClassFrom(ctx)
	return s.classes[class]
}

// replica is one replica's connections and what its probe last found.
type replica struct {
	index int
	dbs   *databases // its connections, in its own budget; dbs.server names it
	set   *replicaSet

	// The probe's own connections, to the replica and to the primary, from
	// the users' configs; used by the probe's goroutine only.
	onReplica, onPrimary probeConn

	caughtUp atomic.Int64                 // unix ns: it had replayed all the primary had written then; 0 never
	probeErr atomic.Pointer[probeFailure] // the last probe's failure, nil after a success
	reads    atomic.Int64                 // read-only calls routed to it
	probes   atomic.Int64                 // probes that read its position
}

// probeFailure is a replica probe's error.
type probeFailure struct{ err error }

// checkReplicas validates opts' replicas against servers and cfg's
// classes, and fills in the defaults.
func checkReplicas(opts *serversOptions, servers map[string]*pgxpool.Config, cfg Config) error {
	for name, r := range opts.replicas {
		for _, class := range r.Classes {
			if _, ok := cfg.Classes[class]; !ok {
				return fmt.Errorf("tenantdb: %w: server %q: Replicas.Classes names %q, which is not one of Config.Classes",
					pool.ErrInvalidConfig, name, class)
			}
		}
		if servers[name] == nil {
			return fmt.Errorf("tenantdb: %w: WithReplicas names server %q, which is not one of NewServers's", pool.ErrInvalidConfig, name)
		}
		if len(r.Configs) == 0 {
			return fmt.Errorf("tenantdb: %w: server %q: WithReplicas needs at least one replica config", pool.ErrInvalidConfig, name)
		}
		for i, c := range r.Configs {
			if c == nil || c.ConnConfig == nil {
				return fmt.Errorf("tenantdb: %w: server %q: replica %d: build its pgxpool.Config with pgxpool.ParseConfig",
					pool.ErrInvalidConfig, name, i)
			}
			if c.MinConns > 0 || c.MinIdleConns > 0 {
				return fmt.Errorf("tenantdb: %w: server %q: replica %d: leave MinConns and MinIdleConns 0, as for the server",
					pool.ErrInvalidConfig, name, i)
			}
		}
		if r.MaxLag < 0 || r.ProbeEvery < 0 {
			return fmt.Errorf("tenantdb: %w: server %q: MaxLag and ProbeEvery must not be negative", pool.ErrInvalidConfig, name)
		}
		if r.MaxLag == 0 {
			r.MaxLag = defaultMaxLag
		}
		if r.ProbeEvery == 0 {
			r.ProbeEvery = r.MaxLag / 5
		}
		if r.ProbeEvery >= r.MaxLag || r.ProbeEvery < time.Millisecond {
			return fmt.Errorf("tenantdb: %w: server %q: ProbeEvery %v must be at least 1ms and below MaxLag %v",
				pool.ErrInvalidConfig, name, r.ProbeEvery, r.MaxLag)
		}
		if r.Unavailable != ReadPrimary && r.Unavailable != FailRead {
			return fmt.Errorf("tenantdb: %w: server %q: unknown Unavailable %d", pool.ErrInvalidConfig, name, r.Unavailable)
		}
		opts.replicas[name] = r
	}
	return nil
}

// newReplicaSet makes server's replicas' connections from r, their
// sessions set up as the primary's and checked against the primary's
// checks: a physical replica has its catalog, role defaults included.
func (p *Pool) newReplicaSet(ctx context.Context, server string, primary *pgxpool.Config, checks *serverChecks, r Replicas, cfg Config,
	idleTTL time.Duration) (*replicaSet, error) {
	set := &replicaSet{fail: r.Unavailable == FailRead, maxLag: r.MaxLag, every: r.ProbeEvery}
	if len(r.Classes) > 0 {
		set.classes = make(map[string]bool, len(r.Classes))
		for _, c := range r.Classes {
			set.classes[c] = true
		}
	}
	for i, c := range r.Configs {
		if err := validateSession(cfg.Session, c.ConnConfig.DefaultQueryExecMode); err != nil {
			set.close()
			return nil, fmt.Errorf("tenantdb: server %q: replica %d: %w", server, i, err)
		}
		pgxCfg, _ := p.session.template(c, cfg, checks)
		dbs := newDatabases(pgxCfg.Copy(), cfg, idleTTL)
		dbs.server = fmt.Sprintf("%s/replica%d", server, i)
		dbs.replicaOf = set
		dbs.admin = &database{name: pgxCfg.ConnConfig.Database, d: dbs}
		dbs.wrapTemplate(pgxCfg, dbs.admin)
		pg, err := pgxpool.NewWithConfig(ctx, pgxCfg)
		if err != nil {
			set.close()
			return nil, fmt.Errorf("tenantdb: server %q: replica %d: %w", server, i, err)
		}
		dbs.admin.pg = pg
		set.list = append(set.list, &replica{index: i, dbs: dbs, set: set,
			onReplica: probeConn{cfg: c.ConnConfig.Copy()}, onPrimary: probeConn{cfg: primary.ConnConfig.Copy()}})
	}
	return set, nil
}

// close closes every replica's connections.
func (s *replicaSet) close() {
	for _, r := range s.list {
		r.dbs.close()
	}
}

// useName returns the use of database name on one of the set's usable
// replicas, taking them in turn, or ErrReplicaUnavailable saying why none
// is.
func (s *replicaSet) useName(name string) (*dbUse, error) {
	now := time.Now().UnixNano()
	first := int(s.turn.Add(1))
	var why error
	for i := range s.list {
		r := s.list[(first+i)%len(s.list)]
		if why = r.unusable(now); why != nil {
			continue
		}
		u, err := r.dbs.useName(name)
		if err != nil {
			why = err
			continue
		}
		r.reads.Add(1)
		return u, nil
	}
	return nil, fmt.Errorf("%w: %w", ErrReplicaUnavailable, why)
}

// unusable says why r may not serve a read at now (unix ns), or returns nil.
func (r *replica) unusable(now int64) error {
	if d := r.dbs.down.Load(); d != nil {
		return fmt.Errorf("%s is down: %w", r.dbs.server, d.err)
	}
	if f := r.probeErr.Load(); f != nil {
		return fmt.Errorf("%s: %w", r.dbs.server, f.err)
	}
	at := r.caughtUp.Load()
	if at == 0 {
		return fmt.Errorf("%s has not been probed yet", r.dbs.server)
	}
	if lag := time.Duration(now - at); lag > r.set.maxLag {
		return fmt.Errorf("%s is %v behind the primary, over MaxLag %v", r.dbs.server, lag.Round(time.Millisecond), r.set.maxLag)
	}
	return nil
}

// lag is how far behind the primary r was at its last probes, as of now: the
// time since it had replayed everything the primary had written; -1 when it
// never had.
func (r *replica) lag() time.Duration {
	at := r.caughtUp.Load()
	if at == 0 {
		return -1
	}
	return time.Since(time.Unix(0, at))
}

// lsnSample is the primary's WAL position at a time.
type lsnSample struct {
	at  int64 // unix ns, before the primary was asked
	lsn uint64
}

// probe compares r's replayed WAL position with the primary's every
// ProbeEvery until ctx ends (Close): r has caught up to the newest sample
// of the primary's position that it has replayed. Each probe's queries end
// within MaxLag, and ctx's end ends one in flight.
func (p *Pool) probe(ctx context.Context, r *replica) {
	defer p.swept.Done()
	defer r.onReplica.close()
	defer r.onPrimary.close()
	samples := make([]lsnSample, 0, int(r.set.maxLag/r.set.every)+2)
	tick := time.NewTicker(r.set.every)
	defer tick.Stop()
	for {
		samples = r.probeOnce(ctx, samples)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// probeOnce is one probe of r: it reads the primary's position, then r's,
// and returns the samples kept for the next.
func (r *replica) probeOnce(ctx context.Context, samples []lsnSample) []lsnSample {
	ctx, cancel := context.WithTimeout(ctx, r.set.maxLag)
	defer cancel()
	at := time.Now().UnixNano()
	if lsn, err := r.onPrimary.lsn(ctx, "select (pg_current_wal_lsn() - '0/0')::int8"); err == nil && lsn != nil {
		if len(samples) == cap(samples) {
			samples = append(samples[:0], samples[1:]...)
		}
		samples = append(samples, lsnSample{at: at, lsn: uint64(*lsn)})
	} // else: r is judged by the samples it has, and falls behind
	replayed, err := r.onReplica.lsn(ctx, "select case when pg_is_in_recovery() then (pg_last_wal_replay_lsn() - '0/0')::int8 end")
	if err == nil && replayed == nil {
		err = errors.New("not in recovery (promoted?), so not a replica of the primary")
	}
	if err != nil {
		r.probeErr.Store(&probeFailure{err: fmt.Errorf("probe: %w", err)})
		return samples
	}
	r.probeErr.Store(nil)
	r.probes.Add(1)
	r.dbs.up() // a call's failed connect marked it down; it answers again
	for i := len(samples) - 1; i >= 0; i-- {
		if samples[i].lsn <= uint64(*replayed) {
			if samples[i].at > r.caughtUp.Load() {
				r.caughtUp.Store(samples[i].at)
			}
			return samples[i:] // older ones say nothing new
		}
	}
	return samples
}

// probeConn is a probe's own connection to a server, outside the Pool's
// pgxpools and budgets, so that the probe never waits for the calls'
// connections.
type probeConn struct {
	cfg  *pgx.ConnConfig
	conn *pgx.Conn // nil until opened, and after a failure
}

// lsn runs sql, a query of one WAL position as int8 (or null), within ctx,
// connecting first if need be; a failure closes the connection.
func (c *probeConn) lsn(ctx context.Context, sql string) (*int64, error) {
	if c.conn == nil {
		conn, err := pgx.ConnectConfig(ctx, c.cfg)
		if err != nil {
			return nil, err
		}
		c.conn = conn
	}
	var v *int64
	if err := c.conn.QueryRow(ctx, sql).Scan(&v); err != nil {
		c.close()
		return nil, err
	}
	return v, nil
}

// close closes the connection, if open.
func (c *probeConn) close() {
	if c.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.conn.Close(ctx)
	c.conn = nil
}

// ReplicaStat is one replica's connections and state.
type ReplicaStat struct {
	// Replica is its index in Replicas.Configs; Name is how errors name it
	// ("eu1/replica0").
	Replica int
	Name    string
	// DatabasesStat is its budget (its config's MaxConns) and connections.
	DatabasesStat
	// Lag is how far behind the primary it was, as of the stat, to within
	// ProbeEvery; -1 before it was first seen caught up.
	Lag time.Duration
	// Usable is whether it takes reads now; Why says why not.
	Usable bool
	Why    string
	// Reads counts the read-only calls routed to it; Probes the probes
	// that read its position.
	Reads, Probes int64
}

// stat returns r's ReplicaStat.
func (r *replica) stat() ReplicaStat {
	s := ReplicaStat{Replica: r.index, Name: r.dbs.server, DatabasesStat: r.dbs.stat(), Lag: r.lag(), Reads: r.reads.Load(),
		Probes: r.probes.Load()}
	if why := r.unusable(time.Now().UnixNano()); why != nil {
		s.Why = why.Error()
	} else {
		s.Usable = true
	}
	return s
}
