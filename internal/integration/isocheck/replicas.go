package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// Reads on a replica (replicas and replicas-tx): tenantdb.NewServers over the
// env's server and a streaming replica of it (tenantdbtest.RunReplica), which
// the Pool reaches through a proxy of the checker's own. A phase of an op may
// be marked tenantdb.ReadOnly (drawn per phase): a hostile statement then runs
// on the replica (the hot standby refuses what writes, not settings, LISTEN's
// cousins, PREPARE, cursors or advisory locks), and the probe reads there,
// where row-level security (the probe's rls column) must show the tenant only
// its own rows. The probe says where it ran (pg_is_in_recovery()): a call not
// marked must never run on the replica, and with FailRead (replicas-tx) a
// marked one never on the primary. A fault loop cuts the replica off (the
// proxy forwards nothing, half the time closing every connection) or pauses
// its replay, so that reads fall back to the primary (ReadPrimary) or fail
// with ErrReplicaUnavailable (FailRead); at the end the replica shows no
// backend of the pool that is not idle.

const (
	replicaServer = "s0"
	replicaMaxLag = 2 * time.Second
)

// replicaEnv is the replica, started the first time a replicas
// configuration runs.
type replicaEnv struct {
	pg    *tenantdbtest.Postgres
	proxy *proxy
	admin *pgxpool.Pool // superuser on the replica, directly
}

// startReplica starts e's replica once, and its proxy.
func (e *env) startReplica(ctx context.Context) (*replicaEnv, error) {
	if e.replica != nil {
		return e.replica, nil
	}
	pg, err := tenantdbtest.RunReplica(ctx, e.pg)
	if err != nil {
		return nil, fmt.Errorf("isocheck: replica: %w", err)
	}
	e.stopped = append(e.stopped, func() { pg.Terminate(context.Background()) })
	px, err := startProxy(pg.Addr, 3)
	if err != nil {
		return nil, err
	}
	e.stopped = append(e.stopped, px.close)
	admin, err := pgxpool.New(ctx, pg.DSN)
	if err != nil {
		return nil, err
	}
	e.stopped = append(e.stopped, admin.Close)
	e.replica = &replicaEnv{pg: pg, proxy: px, admin: admin}
	return e.replica, nil
}

// newReplicaPool is the Pool of a replicas configuration: one server, the
// env's, with the replica behind its proxy, a budget of MaxConns on each.
// It returns once the replica takes reads.
func newReplicaPool(ctx context.Context, e *env, c config, pcfg *pgxpool.Config, cfg tenantdb.Config) (*tenantdb.Pool, func(), error) {
	re, err := e.startReplica(ctx)
	if err != nil {
		return nil, nil, err
	}
	rcfg := pcfg.Copy()
	host, port, err := splitHostPort(re.proxy.addr())
	if err != nil {
		return nil, nil, err
	}
	rcfg.ConnConfig.Host, rcfg.ConnConfig.Port = host, port
	rcfg.ConnConfig.Fallbacks = nil
	cfg.Placement = func(context.Context, string) (tenantdb.Placement, error) {
		return tenantdb.Placement{Server: replicaServer}, nil
	}
	fallback := tenantdb.ReadPrimary
	if c.failRead {
		fallback = tenantdb.FailRead
	}
	p, err := tenantdb.NewServers(ctx, map[string]*pgxpool.Config{replicaServer: pcfg}, cfg,
		tenantdb.WithReplicas(replicaServer, tenantdb.Replicas{
			Configs: []*pgxpool.Config{rcfg}, MaxLag: replicaMaxLag, ProbeEvery: 200 * time.Millisecond, Unavailable: fallback,
		}))
	if err != nil {
		return nil, nil, err
	}
	// The replica must have replayed the setup (and the last run's
	// cut-offs must be over) before reads can be judged.
	for deadline := time.Now().Add(60 * time.Second); !p.ServersStat()[0].Replicas[0].Usable; {
		if time.Now().After(deadline) {
			why := p.ServersStat()[0].Replicas[0].Why
			p.Close()
			return nil, nil, fmt.Errorf("isocheck: the replica did not become usable: %s", why)
		}
		time.Sleep(20 * time.Millisecond) // polling the Pool's stat, not synchronising
	}
	return p, func() {}, nil
}

func splitHostPort(addr string) (string, uint16, error) {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			n, err := strconv.Atoi(addr[i+1:])
			return addr[:i], uint16(n), err
		}
	}
	return "", 0, fmt.Errorf("isocheck: no port in %q", addr)
}

// replicaLoop cuts the replica off, or pauses its replay, every 3 to 8 s
// until ctx ends; each window (and 2 s after) excuses the lost connections
// of read-only calls, and only of those.
func (rc *runCtx) replicaLoop(ctx context.Context, wg *sync.WaitGroup, r *rand.Rand) {
	defer wg.Done()
	re := rc.env.replica
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(3000+r.IntN(5000)) * time.Millisecond):
		}
		d := time.Duration(200+r.IntN(1800)) * time.Millisecond
		rc.mu.Lock()
		w := &dropWindow{from: time.Now(), to: time.Now().Add(time.Hour)}
		rc.replicaCuts = append(rc.replicaCuts, w)
		rc.mu.Unlock()
		if r.IntN(3) == 0 {
			// Replay paused: the replica falls behind MaxLag, its reads go
			// to the primary or fail; nothing breaks.
			bg := context.Background()
			re.admin.Exec(bg, "select pg_wal_replay_pause()")
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
			re.admin.Exec(bg, "select pg_wal_replay_resume()")
			rc.replicaPauses.Add(1)
		} else {
			re.proxy.cutOff(d, r.IntN(2) == 0)
			rc.replicaOut.Add(1)
		}
		rc.faults.Add(1)
		rc.mu.Lock()
		w.to = time.Now().Add(2 * time.Second)
		rc.mu.Unlock()
	}
}

// txReadOnlyKey marks a phase whose transaction is begun with
// pgx.TxOptions{AccessMode: pgx.ReadOnly} instead of a ReadOnly context.
type txReadOnlyKey struct{}

func txReadOnly(ctx context.Context) bool { return ctx.Value(txReadOnlyKey{}) != nil }

// readOnly reports whether the phase of ctx is read-only, by either mark.
func readOnly(ctx context.Context) bool { return tenantdb.IsReadOnly(ctx) || txReadOnly(ctx) }

// replicaCutSince reports whether the replica was cut off or paused at some
// time since started.
func (rc *runCtx) replicaCutSince(started time.Time) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, w := range rc.replicaCuts {
		if w.to.After(started) {
			return true
		}
	}
	return false
}

// judgeReplica judges err of a read-only call in a replicas configuration:
// "" when it is documented (ErrReplicaUnavailable with FailRead, a lost
// connection to the replica while it was cut off), else what is wrong; ok
// false when it says nothing of err.
func (rc *runCtx) judgeReplica(ctx context.Context, err error, started time.Time) (string, bool) {
	if !rc.cfg.replicas {
		return "", false
	}
	if errors.Is(err, tenantdb.ErrReplicaUnavailable) {
		switch {
		case !readOnly(ctx):
			return "ErrReplicaUnavailable for a call not marked ReadOnly: " + err.Error(), true
		case !rc.cfg.failRead:
			return "ErrReplicaUnavailable with ReadPrimary, which falls back: " + err.Error(), true
		}
		return "", true
	}
	if readOnly(ctx) && rc.replicaCutSince(started) && (connLost(err) || errors.Is(err, context.DeadlineExceeded)) {
		return "", true
	}
	return "", false
}

// checkWhere checks where a probe ran in a replicas configuration: a call
// not marked ReadOnly on the primary, a marked one with FailRead on the
// replica.
func (rc *runCtx) checkWhere(ctx context.Context, r probeResult) []string {
	if !rc.cfg.replicas {
		if r.standby == "true" {
			return []string{"the probe ran on a standby without replicas"}
		}
		return nil
	}
	ro := readOnly(ctx)
	switch {
	case r.standby == "true" && !ro:
		return []string{"a call not marked ReadOnly ran on the replica"}
	case r.standby == "false" && ro && rc.cfg.failRead:
		return []string{"a ReadOnly call ran on the primary with FailRead"}
	}
	return nil
}

// checkReplicaHeld is the end of a replicas run: the replica shows no
// backend of the pool that is not idle, and its connections stay within its
// budget.
func (rc *runCtx) checkReplicaHeld(maxConns int) {
	if !rc.cfg.replicas {
		return
	}
	st := rc.pool.ServersStat()[0].Replicas[0]
	if st.Open > st.Budget {
		rc.violate(-1, fmt.Sprintf("at the end: the replica has %d connections open, its budget is %d", st.Open, st.Budget))
	}
	deadline := time.Now().Add(15 * time.Second)
	var busy, all int
	for time.Now().Before(deadline) {
		err := rc.env.replica.admin.QueryRow(context.Background(), `select count(*) filter (where state <> 'idle'), count(*)
			from pg_stat_activity where usename = $1 and backend_type = 'client backend'`, loginRole).Scan(&busy, &all)
		if err == nil && busy == 0 && all <= maxConns+1 { // and the probe's connection
			return
		}
		time.Sleep(50 * time.Millisecond) // polling the replica, not synchronising
	}
	rc.violate(-1, fmt.Sprintf("at the end: the replica shows %d backends of the pool, %d of them not idle (budget %d)", all, busy, maxConns))
}

// sampleReplica counts the pool's backends on the replica, as the sampler
// does on the primary: more than limit (the replica's budget and its lag
// probe's connection) for over a second is a violation.
func (rc *runCtx) sampleReplica(ctx context.Context, overSince *time.Time, limit int) {
	if !rc.cfg.replicas {
		return
	}
	var n int
	err := rc.env.replica.admin.QueryRow(ctx, `select count(*) from pg_stat_activity
		where usename = $1 and backend_type = 'client backend'`, loginRole).Scan(&n)
	switch {
	case err != nil || n <= limit:
		*overSince = time.Time{}
	case overSince.IsZero():
		*overSince = time.Now()
	case time.Since(*overSince) > time.Second:
		rc.violate(-1, fmt.Sprintf("the replica counted %d backends of the pool for over a second, the limit is %d", n, limit))
		*overSince = time.Time{}
	}
}
