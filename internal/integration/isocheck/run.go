package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantsql"
)

// violation is one broken invariant: seq is the op it was seen after (-1:
// seen by the sampler or at the end of the run).
type violation struct {
	seq int64
	op  string
	msg string
	at  time.Duration // since the run started
}

// runCtx is one run of one configuration on a fresh Pool.
type runCtx struct {
	ctx       context.Context
	cfg       config
	env       *env
	pool      *tenantdb.Pool
	db        *sql.DB
	adminPool *pgxpool.Pool
	runID     int
	started   time.Time

	seq, ops, hostiles, faults atomic.Int64
	lastFault                  atomic.Int64 // unix nanos: errors of ops running until then may be a fault's
	faulting                   atomic.Bool  // a fault is under way
	poolerDied                 atomic.Bool  // PgBouncer died and could not be started again: the run stops
	poolerRestarts             int          // PgBouncer died and was started again (bouncer.go)
	poolerLog                  string       // the log of the last PgBouncer that died

	mu          sync.Mutex
	violations  []violation
	stickyState map[string]map[string]bool
	roleDirty   int            // ops left before the checker undoes a hostile ALTER ROLE
	accepted    map[string]int // accepted errors of non-hostile statements, by kind
	undoRaces   [][2]time.Time // backends started then may have an undone ALTER ROLE's defaults
	executed    []op
	seqOf       []int64
	drops       map[string][]*dropWindow // guarded by mu: when each tenant's database was missing
	redisCuts   []*dropWindow            // guarded by mu: when Redis was cut off

	adapters *adapters // the HTTP middleware and the Runner (adapters.go)
	// excl is held shared by every op and fault, and alone by an op of the
	// tenant with a bad role, which must run with nothing else.
	excl                   sync.RWMutex
	adminMu                sync.Mutex // the undo of ALTER ROLE and a dropped database, one at a time
	dbDrops, redisOut      atomic.Int64
	srvMoves, srvMoveFails int // the servers configuration's Moves done and failed

	replicaCuts               []*dropWindow        // guarded by mu: when the replica was cut off or paused (replicas.go)
	replicaOut, replicaPauses atomic.Int64         // the replica's cut-offs and replay pauses
	holdEnds                  atomic.Int64         // holds that tenantdb ended for a time limit (held.go)
	replicaStat               tenantdb.ReplicaStat // the replica's, at the end of the run
}

func (rc *runCtx) violate(seq int64, msg string) {
	rc.violateOp(seq, "", msg)
}

func (rc *runCtx) violateOp(seq int64, o string, msg string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.violations) < 100 {
		rc.violations = append(rc.violations, violation{seq: seq, op: o, msg: msg, at: time.Since(rc.started)})
	}
}

func (rc *runCtx) violationCount() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.violations)
}

func (rc *runCtx) markSticky(tenant, s string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.stickyState[tenant] == nil {
		rc.stickyState[tenant] = map[string]bool{}
	}
	rc.stickyState[tenant][s] = true
}

func (rc *runCtx) sticky(tenant string) map[string]bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	m := map[string]bool{}
	for k, v := range rc.stickyState[tenant] {
		m[k] = v
	}
	return m
}

func (rc *runCtx) markRoleDefaults() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.roleDirty == 0 {
		rc.roleDirty = 8
	}
}

// afterOp undoes a hostile ALTER ROLE a few operations after it ran: long
// enough for another tenant's new connection to meet it, short enough that
// the run does not spend itself on ErrRoleDefaultsChanged.
func (rc *runCtx) afterOp() {
	rc.mu.Lock()
	undo := false
	if rc.roleDirty > 0 {
		rc.roleDirty--
		undo = rc.roleDirty == 0
	}
	rc.mu.Unlock()
	if undo {
		// A fault like the others: never while the tenant with a bad role
		// runs alone (badrole.go), whose connections it would end.
		rc.excl.RLock()
		defer rc.excl.RUnlock()
		var b strings.Builder
		for _, r := range rc.env.roles() {
			fmt.Fprintf(&b, "alter role %s reset all;\n", r)
			for _, d := range rc.env.databases() {
				fmt.Fprintf(&b, "alter role %s in database %s reset all;\n", r, d)
			}
		}
		from := time.Now().Add(-2 * time.Second)
		bg := context.Background()
		rc.adminMu.Lock()
		rc.adminPool.Exec(bg, b.String())
		rc.adminMu.Unlock()
		// A connection whose session started with the hostile defaults but
		// whose check ran after the undo above cannot tell: end those.
		rc.faulting.Store(true)
		rc.mu.Lock()
		rc.undoRaces = append(rc.undoRaces, [2]time.Time{from, time.Now()})
		rc.mu.Unlock()
		rc.adminPool.Exec(bg, `select pg_terminate_backend(pid) from pg_stat_activity
			where usename = $1 and backend_start >= $2`, loginRole, from)
		rc.faultUntil(time.Now().Add(2 * time.Second))
		rc.faulting.Store(false)
	}
}

// inUndoRace reports whether a backend that started at ms (unix
// milliseconds, as the probe reports it) started in the window of an undo of
// a hostile ALTER ROLE, and was ended for it.
func (rc *runCtx) inUndoRace(ms string) bool {
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return false
	}
	t := time.UnixMilli(n)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, w := range rc.undoRaces {
		if !t.Before(w[0]) && !t.After(w[1]) {
			return true
		}
	}
	return false
}

// faultSince reports whether a fault of the checker's own happened since t.
func (rc *runCtx) faultSince(t time.Time) bool {
	return rc.faulting.Load() || rc.lastFault.Load() >= t.UnixNano()
}

// faultUntil excuses the errors of ops that run until t (a fault's effects
// may take that long to meet a statement).
func (rc *runCtx) faultUntil(t time.Time) {
	for {
		old := rc.lastFault.Load()
		if old >= t.UnixNano() || rc.lastFault.CompareAndSwap(old, t.UnixNano()) {
			return
		}
	}
}

// runOptions say how long and how hard one run goes.
type runOptions struct {
	seed     uint64
	maxConns int
	workers  int
	duration time.Duration
	faults   bool
	noModes  bool
	// plan, when set, replays these ops per worker instead of drawing new ones.
	plan [][]op
	// stopOnViolation ends the run at its first violation.
	stopOnViolation bool
}

var runIDs atomic.Int64

// runOnce runs configuration c once on a fresh Pool and returns it, finished.
func runOnce(parent context.Context, e *env, c config, o runOptions) (*runCtx, error) {
	if err := e.clean(parent); err != nil {
		return nil, err
	}
	rc := &runCtx{cfg: c, env: e, stickyState: map[string]map[string]bool{}, drops: map[string][]*dropWindow{}}
	p, prefix, closePool, err := c.newPool(parent, e, o.maxConns)
	if err != nil {
		return nil, err
	}
	adminPool, err := pgxpool.New(parent, e.pg.DSN)
	if err != nil {
		closePool()
		return nil, err
	}
	defer adminPool.Close()
	ctx, stop := context.WithCancel(parent)
	defer stop()
	rc.ctx, rc.pool, rc.adminPool = ctx, p, adminPool
	rc.runID, rc.started = int(runIDs.Add(1))+int(time.Now().Unix()%100000)*1000, time.Now()
	rc.db = tenantsql.OpenDB(p)
	if err := rc.startAdapters(c, o.maxConns); err != nil {
		closePool()
		return nil, err
	}

	limit := o.maxConns
	if c.pooler {
		limit = max(limit, 3)
	}
	if c.replicas {
		limit++ // the replica's lag probe has a connection to the primary beyond the budget (docs/servers.md)
	}
	var bg sync.WaitGroup
	sctx, sstop := context.WithCancel(ctx)
	bg.Add(1)
	go (&sampler{rc: rc, admin: adminPool, limit: limit}).run(sctx, &bg)
	if o.faults && c.proxied {
		e.proxy.setRun(func() {
			rc.faults.Add(1)
			rc.faultUntil(time.Now().Add(2 * time.Second))
		})
		defer e.proxy.setRun(nil)
	}
	if o.faults {
		bg.Add(1)
		go rc.faultLoop(sctx, &bg, rand.New(rand.NewPCG(o.seed, 1<<40)))
	}
	if o.faults && c.cluster {
		bg.Add(1)
		go rc.redisLoop(sctx, &bg, rand.New(rand.NewPCG(o.seed, 1<<41)))
	}
	if o.faults && c.replicas {
		bg.Add(1)
		go rc.replicaLoop(sctx, &bg, rand.New(rand.NewPCG(o.seed, 1<<42)))
	}

	deadline := time.Now().Add(o.duration)
	var wg sync.WaitGroup
	for w := range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(o.seed, uint64(w)))
			r2 := rand.New(rand.NewPCG(o.seed, uint64(w)|1<<32))
			for i := 0; ; i++ {
				if ctx.Err() != nil {
					return
				}
				var next op
				if o.plan != nil {
					if i >= len(o.plan[w]) {
						return
					}
					next = o.plan[w][i]
				} else {
					if time.Now().After(deadline) {
						return
					}
					next = genOp(r, r2, c, w)
					if o.noModes {
						next.mode = 0
					}
				}
				seq := rc.seq.Add(1)
				rc.mu.Lock()
				rc.executed = append(rc.executed, next)
				rc.seqOf = append(rc.seqOf, seq)
				rc.mu.Unlock()
				opStart := time.Now()
				if next.badRole {
					rc.excl.Lock()
				} else {
					rc.excl.RLock()
				}
				bad := rc.exec(next)
				if next.badRole {
					rc.excl.Unlock()
				} else {
					rc.excl.RUnlock()
				}
				rc.ops.Add(1)
				if d := time.Since(opStart); d > 45*time.Second {
					bad = append(bad, fmt.Sprintf("the operation took %v; its contexts allow 40 s", d.Round(time.Millisecond)))
				}
				for _, m := range bad {
					rc.violateOp(seq, next.String(), m)
				}
				rc.afterOp()
				if rc.poolerDied.Load() {
					stop()
					return
				}
				if o.stopOnViolation && rc.violationCount() > 0 {
					stop()
					return
				}
			}
		}()
	}
	wg.Wait()
	sstop()
	bg.Wait()
	rc.adapters.close(rc)
	rc.checkNothingHeld()
	rc.checkReplicaHeld(o.maxConns)
	if c.replicas {
		rc.replicaStat = rc.pool.ServersStat()[0].Replicas[0]
	}
	rc.audit(context.Background())
	rc.auditDatabases(context.Background())
	rc.db.Close()
	if c.pooler && e.bouncer != nil {
		rc.poolerRestarts, rc.poolerLog = e.bouncer.died()
	}
	closePool()
	if c.cluster {
		rc.auditLeases(prefix)
	}
	return rc, nil
}

// faultLoop ends a random backend of the pools from an admin connection now
// and then: the faults every tenant's calls must survive with an error of
// their own or none.
func (rc *runCtx) faultLoop(ctx context.Context, wg *sync.WaitGroup, r *rand.Rand) {
	defer wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(500+r.IntN(2000)) * time.Millisecond):
		}
		rc.excl.RLock()
		if rc.cfg.database && r.IntN(4) == 0 {
			if err := rc.dropDatabase(r); err != nil {
				rc.violate(-1, "the checker's own fault: "+err.Error())
			}
			rc.excl.RUnlock()
			continue
		}
		rc.faulting.Store(true)
		var n int
		// Mostly an idle one: the next holder's first statement meets it.
		err := rc.adminPool.QueryRow(ctx, `select count(pg_terminate_backend(pid)) from
			(select pid from pg_stat_activity where usename = $1 and backend_type = 'client backend'
			 order by (state = 'idle' and $2) desc, random() limit 1) s`, loginRole, r.IntN(3) > 0).Scan(&n)
		rc.faultUntil(time.Now().Add(2 * time.Second))
		rc.faulting.Store(false)
		rc.excl.RUnlock()
		if err == nil && n > 0 {
			rc.faults.Add(1)
		}
	}
}

// topAccepted describes the most frequent accepted errors.
func (rc *runCtx) topAccepted(n int) string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range rc.accepted {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	var b strings.Builder
	for i, x := range all {
		if i == n {
			break
		}
		fmt.Fprintf(&b, "; %d× %s", x.v, x.k)
	}
	return b.String()
}

// sortedViolations returns the run's violations, the earliest op first.
func (rc *runCtx) sortedViolations() []violation {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	v := append([]violation(nil), rc.violations...)
	sort.SliceStable(v, func(i, j int) bool { return v[i].seq >= 0 && (v[j].seq < 0 || v[i].seq < v[j].seq) })
	return v
}

func (e *env) roles() []string {
	r := []string{loginRole}
	for _, t := range e.tenants {
		r = append(r, tenantRole(t), "iso_"+tag(t))
	}
	return r
}

func (e *env) databases() []string {
	d := []string{`"` + e.templateDB + `"`}
	for _, t := range e.tenants {
		d = append(d, tenantDatabase(t))
	}
	return d
}
