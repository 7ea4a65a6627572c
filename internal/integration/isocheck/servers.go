package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tenantdb/tenantsql"
)

// The servers configuration: tenantdb.NewServers over three PostgreSQL
// servers (the env's and two more), a database per tenant on each (or one
// database that every tenant shares, servers-shared), tenants
// placed across them by Config.Placement and moved between them by
// Pool.Move under load, a server's backends killed now and then. Every
// statement of a tenant records, in the database that ran it, the server's
// name; the checks are that it ran on its tenant's server and database, that
// nothing of a moved tenant ran on its old server after the fence, that each
// server's pg_stat_activity stays within its budget, and that a fault on one
// server costs no other server's tenants an error.

const (
	numServers  = 3
	srvTenants  = 6 // tenants of the servers configuration
	srvWorkers  = 8
	srvDBPrefix = "srv_"
)

// srvShared is the database of every tenant of servers-shared, on each
// server: there the tenants share its connections.
const srvShared = srvDBPrefix + "shared"

func serverName(i int) string          { return fmt.Sprintf("s%d", i) }
func srvDatabase(tenant string) string { return srvDBPrefix + tenant }

// srvDatabases are the databases the servers configuration makes on each
// server.
func srvDatabases() []string {
	dbs := []string{srvShared}
	for t := range srvTenants {
		dbs = append(dbs, srvDatabase(tenantName(t)))
	}
	return dbs
}

// srvEnv is the servers the servers configuration runs on, started once.
type srvEnv struct {
	pgs    []*tenantdbtest.Postgres
	admins []*pgxpool.Pool // superuser, in each server's own database
}

// startServers starts the two more servers the servers configuration needs,
// the first time it runs, and creates on each the login role and a database
// per tenant.
func (e *env) startServers(ctx context.Context) (*srvEnv, error) {
	if e.srv != nil {
		return e.srv, nil
	}
	s := &srvEnv{pgs: []*tenantdbtest.Postgres{e.pg}}
	for range numServers - 1 {
		pg, err := tenantdbtest.RunPostgres(ctx, tenantdbtest.WithMaxConnections(100))
		if err != nil {
			return nil, err
		}
		e.stopped = append(e.stopped, func() { pg.Terminate(context.Background()) })
		s.pgs = append(s.pgs, pg)
	}
	for i, pg := range s.pgs {
		admin, err := pgxpool.New(ctx, pg.DSN)
		if err != nil {
			return nil, err
		}
		e.stopped = append(e.stopped, admin.Close)
		s.admins = append(s.admins, admin)
		if i > 0 {
			if _, err := admin.Exec(ctx, fmt.Sprintf("create role %s login password '%s' nosuperuser nobypassrls nocreaterole",
				loginRole, loginPass)); err != nil {
				return nil, fmt.Errorf("isocheck: servers: %w", err)
			}
		}
		for _, db := range srvDatabases() {
			if _, err := admin.Exec(ctx, "create database "+db); err != nil {
				return nil, fmt.Errorf("isocheck: servers: %w", err)
			}
			cfg, _ := pgx.ParseConfig(pg.DSN)
			cfg.Database = db
			c, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				return nil, err
			}
			_, err = c.Exec(ctx, fmt.Sprintf(`create table here (server text);
insert into here values ('%s');
create table calls (tenant text, run int, nonce int, db text default current_database(),
  setting text default coalesce(current_setting('iso.tenant', true), ''), at timestamptz default clock_timestamp());
grant select on here to public;
grant select, insert on calls to public;`, serverName(i)))
			c.Close(ctx)
			if err != nil {
				return nil, fmt.Errorf("isocheck: servers: %w", err)
			}
		}
	}
	// Servers set up apart differ in the login role's own defaults: each
	// server's connections must be judged by that server's (tenantdb read
	// them once for all servers, and refused every connection to the
	// servers that differed from the first one opened).
	for i, sql := range srvRoleDefaults {
		if sql == "" {
			continue
		}
		if _, err := s.admins[i].Exec(ctx, fmt.Sprintf(sql, loginRole)); err != nil {
			return nil, fmt.Errorf("isocheck: servers: %w", err)
		}
	}
	e.srv = s
	return s, nil
}

// srvRoleDefaults are the login role's defaults on each server (a format of
// the role's name), none on s0, whose are the env's: harmless settings that
// only say that the servers were set up apart.
var srvRoleDefaults = [numServers]string{
	"",
	"alter role %s set work_mem = '8MB'",
	"alter role %s in database " + srvDBPrefix + "t2 set work_mem = '16MB'",
}

// srvHostile is a hostile statement of the servers configuration: leftovers
// tagged with the tenant, a statement cut by its deadline (a cancel request
// to the right server), the end of its own backend (a fault on its server),
// and new defaults of the login role on its server ({otherdb}: another
// tenant's database there), which tenantdb must refuse on that server's new
// connections and on no other server's (roledirt).
var srvHostile = []struct {
	name, sql    string
	cut          bool
	roleDefaults bool
}{
	{name: "set-setting", sql: "set iso.tenant = '{tag}'"},
	{name: "set-other-setting", sql: "set iso.other = '{tag}'"}, // not among the tenant's values: only a reset ends it
	{name: "set_config", sql: "select set_config('iso.tenant', '{tag}', false)"},
	{name: "listen", sql: "listen {tag}"},
	{name: "prepare", sql: "prepare {tag}_p as select 1"},
	{name: "advisory-lock", sql: "select pg_try_advisory_lock(4242, {n})"}, // {n}: the tenant's index
	{name: "sleep-cut", sql: "select pg_sleep(5)", cut: true},
	{name: "terminate-own-backend", sql: "select pg_terminate_backend(pg_backend_pid())"},
	{name: "alter-role-set", sql: "alter role current_user set search_path = {tag}, public", roleDefaults: true},
	{name: "alter-role-read-only", sql: "alter role current_user set default_transaction_read_only = on", roleDefaults: true},
	{name: "alter-role-in-database", sql: "alter role current_user in database {otherdb} set search_path = {tag}, public", roleDefaults: true},
	{name: "alter-role-in-database-read-only", sql: "alter role current_user in database {otherdb} set default_transaction_read_only = on", roleDefaults: true},
}

// srvRun is one run of the servers configuration: where each tenant is, and
// when each server had a fault.
type srvRun struct {
	rc               *runCtx
	se               *srvEnv
	mu               sync.Mutex
	dir              map[string]string        // the directory Config.Placement reads: tenant -> server
	pos              map[string][]string      // each tenant's servers, in the order it was placed there
	mv               map[string][]*window     // each tenant's moves, from Move's call to its return
	off              map[[2]string][]*window  // (tenant, server): from the fence on the server's clock to the tenant's return there
	flt              map[string]time.Time     // server -> until when a fault on it excuses lost connections
	pinned           map[string]*sync.RWMutex // tenant -> held by its hostile ALTER ROLE (shared) and its Move
	moves, moveFails int
	roles            roleDirt // the login role's hostile defaults on each server, and their undo
}

// db is tenant t's database on every server.
func (sr *srvRun) db(t string) string {
	if sr.rc.cfg.sharedDB {
		return srvShared
	}
	return srvDatabase(t)
}

// window is an interval; a zero end is open.
type window struct{ from, to time.Time }

func (w *window) overlaps(from, to time.Time) bool {
	return !to.Before(w.from) && (w.to.IsZero() || !from.After(w.to))
}

// runServers runs the servers configuration once and returns it, finished.
func runServers(parent context.Context, e *env, c config, o runOptions) (*runCtx, error) {
	// s0 is the env's server: a hostile ALTER ROLE of an earlier
	// configuration, which ended before its undo (run.go), is undone first.
	if err := e.clean(parent); err != nil {
		return nil, err
	}
	se, err := e.startServers(parent)
	if err != nil {
		return nil, err
	}
	rc := &runCtx{cfg: c, env: e, stickyState: map[string]map[string]bool{}}
	sr := &srvRun{rc: rc, se: se, dir: map[string]string{}, pos: map[string][]string{}, mv: map[string][]*window{},
		off: map[[2]string][]*window{}, flt: map[string]time.Time{}}
	sr.roles.init(se.admins)
	if err := sr.roles.undoAll(parent); err != nil { // what a run stopped early left
		return nil, err
	}
	tenants := make([]string, srvTenants)
	sr.pinned = map[string]*sync.RWMutex{}
	for i := range tenants {
		tenants[i] = tenantName(i)
		sr.pinned[tenants[i]] = &sync.RWMutex{}
		sr.dir[tenants[i]] = serverName(i % numServers)
		sr.pos[tenants[i]] = []string{serverName(i % numServers)}
	}
	for _, a := range se.admins {
		if _, err := a.Exec(parent, "select pg_terminate_backend(pid) from pg_stat_activity where usename = $1", loginRole); err != nil {
			return nil, err
		}
	}
	servers := map[string]*pgxpool.Config{}
	for i, pg := range se.pgs {
		u, _ := url.Parse(pg.DSN)
		u.User = url.UserPassword(loginRole, loginPass)
		pcfg, err := pgxpool.ParseConfig(withParam(u.String(), "connect_timeout", "5"))
		if err != nil {
			return nil, err
		}
		pcfg.MaxConns = int32(o.maxConns)
		pcfg.ConnConfig.RuntimeParams["application_name"] = appName
		if c.scope == tenantdb.ScopeTransaction {
			pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // as NewServers requires
		}
		servers[serverName(i)] = pcfg
	}
	p, err := tenantdb.NewServers(parent, servers, tenantdb.Config{
		Plans:   map[string]pool.Plan{"default": {MaxConns: max(1, o.maxConns-1), MaxWaiting: tenantdb.Unbounded}},
		Session: pool.Session{Scope: c.scope, TenantSetting: settingKey},
		Logger:  slog.New(slog.DiscardHandler),
		// The directory is asked again often: its answer must agree with Move's.
		LookupTTL: 200 * time.Millisecond,
		Placement: func(_ context.Context, t string) (tenantdb.Placement, error) {
			sr.mu.Lock()
			defer sr.mu.Unlock()
			return tenantdb.Placement{Server: sr.dir[t], Database: sr.db(t)}, nil
		},
	})
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(parent)
	defer stop()
	rc.ctx, rc.pool = ctx, p
	rc.runID, rc.started = int(runIDs.Add(1))+int(time.Now().Unix()%100000)*1000, time.Now()
	rc.db = tenantsql.OpenDB(p)

	var bg sync.WaitGroup
	sctx, sstop := context.WithCancel(ctx)
	bg.Add(2)
	go sr.sample(sctx, &bg, o.maxConns, tenants)
	go sr.moveLoop(sctx, &bg, rand.New(rand.NewPCG(o.seed, 1<<42)), tenants)
	if o.faults {
		bg.Add(1)
		go sr.faultLoop(sctx, &bg, rand.New(rand.NewPCG(o.seed, 1<<40)))
	}
	deadline := time.Now().Add(o.duration)
	var wg sync.WaitGroup
	for w := range srvWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(o.seed, uint64(w)))
			for ctx.Err() == nil && time.Now().Before(deadline) {
				seq := rc.seq.Add(1)
				desc, bad := sr.op(r, tenants[w%srvTenants])
				rc.ops.Add(1)
				sr.roles.afterOp(ctx)
				for _, m := range bad {
					rc.violateOp(seq, fmt.Sprintf("w%d %s", w, desc), m)
				}
				if o.stopOnViolation && rc.violationCount() > 0 {
					stop()
				}
			}
		}()
	}
	wg.Wait()
	sstop()
	bg.Wait()
	if err := sr.roles.undoAll(context.Background()); err != nil {
		rc.violate(-1, "undo the login role's hostile defaults: "+err.Error())
	}
	rc.checkNothingHeld()
	for _, s := range p.ServersStat() {
		if s.InUse != 0 || s.Reserved != 0 {
			rc.violate(-1, fmt.Sprintf("at the end: server %s has %d slots in use, %d reserved", s.Server, s.InUse, s.Reserved))
		}
	}
	rc.db.Close()
	p.Close()
	sr.audit(context.Background(), tenants)
	sr.mu.Lock()
	rc.srvMoves, rc.srvMoveFails = sr.moves, sr.moveFails
	sr.mu.Unlock()
	return rc, nil
}

// at returns the servers tenant t has been on since its i-th placement, and
// the index of its latest.
func (sr *srvRun) at(t string, i int) ([]string, int) {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	h := sr.pos[t]
	return append([]string(nil), h[i:]...), len(h) - 1
}

// op is one operation of tenant t: maybe a hostile statement in a call of
// its own, then the probe, which records the call where it ran and returns
// what it saw.
func (sr *srvRun) op(r *rand.Rand, t string) (string, []string) {
	rc := sr.rc
	var bad []string
	_, i0 := sr.at(t, 0)
	started := time.Now()
	desc := t
	if r.IntN(10) < 3 {
		h := srvHostile[r.IntN(len(srvHostile))]
		desc += " hostile " + h.name
		ctx, cancel := context.WithTimeout(tenantdb.WithTenant(rc.ctx, t), 20*time.Second)
		if h.cut {
			cancel()
			ctx, cancel = context.WithTimeout(tenantdb.WithTenant(rc.ctx, t), time.Duration(20+r.IntN(500))*time.Millisecond)
		}
		if h.name == "terminate-own-backend" {
			srv, _ := sr.at(t, i0)
			for _, s := range srv {
				sr.fault(s) // its own backend ends: a fault of its server
			}
		}
		var dirty []string // where the statement may run
		if h.roleDefaults {
			// No Move of the tenant starts until it returns (it may wait
			// for admission, then run where a Move took the tenant), nor
			// runs meanwhile.
			sr.pinned[t].RLock()
			dirty, _ = sr.at(t, i0)
			sr.roles.begin(dirty)
		}
		other := sr.db(tenantName((tenantIndex(t) + 1) % srvTenants)) // the tenant's own under servers-shared
		_, err := rc.pool.Exec(ctx, strings.NewReplacer("{tag}", tag(t), "{otherdb}", other,
			"{n}", fmt.Sprint(tenantIndex(t))).Replace(h.sql))
		rc.hostiles.Add(1)
		if h.roleDefaults {
			sr.roles.end(dirty)
			sr.pinned[t].RUnlock()
		}
		if h.name == "terminate-own-backend" {
			srv, _ := sr.at(t, i0)
			for _, s := range srv {
				sr.fault(s) // wherever it ran, its next call may meet the dead connection
			}
		}
		if err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				if m := sr.judge(ctx, t, err, i0, started); m != "" {
					bad = append(bad, "hostile statement: "+m)
				}
			}
		}
		cancel()
	}
	ctx, cancel := context.WithTimeout(tenantdb.WithTenant(rc.ctx, t), 20*time.Second)
	defer cancel()
	if r.IntN(4) == 0 {
		d := time.Duration(1+r.IntN(300)) * time.Millisecond
		if r.IntN(2) == 0 {
			ctx, cancel = context.WithTimeout(ctx, d)
		} else {
			ctx, cancel = context.WithCancel(ctx)
			tm := time.AfterFunc(d, cancel)
			defer tm.Stop()
		}
		defer cancel()
		desc += fmt.Sprintf(", probe deadline %v", d)
	}
	nonce := r.Int32()
	path := r.IntN(6)
	desc += ", probe via " + []string{"QueryRow", "Query", "SendBatch", "Begin+savepoint", "AcquireFunc", "tenantsql"}[path]
	var server, db, setting, searchPath, other, listens, prepared, advisory string
	var n int32
	err := sr.probe(ctx, path, t, nonce, &n, &server, &db, &setting, &searchPath, &other, &listens, &prepared, &advisory)
	if err != nil {
		if m := sr.judge(ctx, t, err, i0, started); m != "" {
			bad = append(bad, m)
		}
		return desc, bad
	}
	allowed, _ := sr.at(t, i0)
	switch {
	case n != nonce:
		bad = append(bad, fmt.Sprintf("the probe answered nonce %d, not %d", n, nonce))
	case !contains(allowed, server):
		bad = append(bad, fmt.Sprintf("ran on server %s; its tenant was on %v during the call", server, allowed))
	case db != sr.db(t):
		bad = append(bad, fmt.Sprintf("ran in database %q, not %q", db, sr.db(t)))
	case setting != t && setting != tag(t):
		bad = append(bad, fmt.Sprintf("%s is %q, not %q", settingKey, setting, t))
	case tagRE.MatchString(searchPath):
		// Only the login role's hostile defaults set a search_path: a
		// session that started with them was to be refused.
		bad = append(bad, fmt.Sprintf("search_path is %q on server %s: a hostile login role default reached a session", searchPath, server))
	}
	// What another tenant's session left: its tag in a setting, a channel
	// or a statement name, or its advisory lock (keyed by its index).
	for _, f := range [][2]string{{"iso.other", other}, {"listen", listens}, {"prepared", prepared}} {
		for _, found := range tagRE.FindAllString(f[1], -1) {
			if found != tag(t) {
				bad = append(bad, fmt.Sprintf("%s is %q on server %s: %s's leftover", f[0], f[1], server, strings.TrimPrefix(found, "evil_")))
			}
		}
	}
	for _, key := range strings.Split(advisory, ",") {
		if key != "" && key != fmt.Sprint(tenantIndex(t)) {
			bad = append(bad, fmt.Sprintf("the session holds the advisory lock of t%s on server %s", key, server))
		}
	}
	return desc, bad
}

var serverRE = regexp.MustCompile(`server "(s[0-9]+)"`)

func contains(s []string, x string) bool {
	for _, y := range s {
		if y == x {
			return true
		}
	}
	return false
}

// probeInsert records the call in the database that runs it and returns
// the nonce, that server's name, the database, the tenant setting, the
// search_path, and what a session can keep: another setting, the channels
// it listens on, its prepared statements, the second keys of its advisory
// locks.
const probeInsert = `insert into calls (tenant, run, nonce) values ($1, $2, $3)
 returning nonce, (select server from here), db, setting, current_setting('search_path'),
 coalesce(current_setting('iso.other', true), ''),
 coalesce((select string_agg(c, ',') from pg_listening_channels() c), ''),
 coalesce((select string_agg(name, ',') from pg_prepared_statements), ''),
 coalesce((select string_agg(objid::text, ',') from pg_locks where pid = pg_backend_pid() and locktype = 'advisory'), '')`

// probe sends probeInsert by path.
func (sr *srvRun) probe(ctx context.Context, path int, t string, nonce int32, dest ...any) error {
	p, args := sr.rc.pool, []any{t, sr.rc.runID, nonce}
	switch path {
	case 0:
		return p.QueryRow(ctx, probeInsert, args...).Scan(dest...)
	case 1:
		rows, err := p.Query(ctx, probeInsert, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		if !rows.Next() {
			if err := rows.Err(); err != nil {
				return err
			}
			return errors.New("the probe returned no row")
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	case 2:
		b := &pgx.Batch{}
		b.Queue("select 1")
		b.Queue(probeInsert, args...)
		br := p.SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
		if err := br.QueryRow().Scan(dest...); err != nil {
			br.Close()
			return err
		}
		return br.Close()
	case 3:
		return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
			return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				return sp.QueryRow(ctx, probeInsert, args...).Scan(dest...)
			})
		})
	case 4:
		return p.AcquireFunc(ctx, func(c tenantdb.Conn) error {
			return c.QueryRow(ctx, probeInsert, args...).Scan(dest...)
		})
	default:
		return sr.rc.db.QueryRowContext(ctx, probeInsert, args...).Scan(dest...)
	}
}

// judge returns "" when err is acceptable for a call of tenant t that began
// at started, its tenant's placement then being the i0-th: its context's
// error once it ended, ErrMoved while the tenant was being moved, a lost
// connection or ErrServerDown after a fault on one of its servers.
func (sr *srvRun) judge(ctx context.Context, t string, err error, i0 int, started time.Time) string {
	var pgErr *pgconn.PgError
	isPg := errors.As(err, &pgErr)
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) || isPg && pgErr.Code == "57014" && strings.Contains(pgErr.Message, "user request") {
			sr.rc.countAccepted(err)
			return ""
		}
	}
	now := time.Now()
	sr.mu.Lock()
	moving := false
	for _, w := range sr.mv[t] {
		moving = moving || w.overlaps(started, now)
	}
	servers := append([]string(nil), sr.pos[t][i0:]...)
	faulted := false
	for _, s := range servers {
		faulted = faulted || !sr.flt[s].Before(started)
	}
	sr.mu.Unlock()
	if errors.Is(err, tenantdb.ErrMoved) && moving {
		sr.rc.countAccepted(err)
		return ""
	}
	// A server whose login role a tenant gave defaults refuses its new
	// connections until they are undone: only the tenants on that server.
	if errors.Is(err, tenantdb.ErrRoleDefaultsChanged) && sr.roles.dirtyDuring(servers, started, now) {
		sr.rc.countAccepted(err)
		return ""
	}
	if (connLost(err) || errors.Is(err, tenantdb.ErrServerDown)) && faulted {
		sr.rc.countAccepted(err)
		return ""
	}
	// A connect that used all of its connect_timeout marks its server down,
	// and its tenants' calls fail with ErrServerDown for a moment
	// (docs/servers.md): documented, when every server the error names is
	// one the tenant was on.
	if named := serverRE.FindAllStringSubmatch(err.Error(), -1); len(named) > 0 &&
		(errors.Is(err, tenantdb.ErrServerDown) || connectTimedOut(err)) {
		ok := true
		for _, m := range named {
			ok = ok && contains(servers, m[1])
		}
		if ok {
			sr.rc.countAccepted(errors.New("server down or connect timed out (" + named[0][1] + ")"))
			return ""
		}
	}
	return fmt.Sprintf("unexpected error (tenant on %v, moving %v, fault there %v): %v", servers, moving, faulted, err)
}

// fault records a fault on server s: lost connections of calls running
// until two seconds from now are its.
func (sr *srvRun) fault(s string) {
	sr.mu.Lock()
	sr.flt[s] = time.Now().Add(2 * time.Second)
	sr.mu.Unlock()
}

// faultLoop kills backends of the pool on one server at a time: one, mostly
// idle, or all of them.
func (sr *srvRun) faultLoop(ctx context.Context, wg *sync.WaitGroup, r *rand.Rand) {
	defer wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(500+r.IntN(2000)) * time.Millisecond):
		}
		i := r.IntN(numServers)
		limit := 1
		if r.IntN(3) == 0 {
			limit = 1000
		}
		sr.fault(serverName(i))
		var n int
		err := sr.se.admins[i].QueryRow(ctx, `select count(pg_terminate_backend(pid)) from
			(select pid from pg_stat_activity where usename = $1 and backend_type = 'client backend'
			 order by (state = 'idle') desc, random() limit $2) s`, loginRole, limit).Scan(&n)
		sr.fault(serverName(i))
		if err == nil && n > 0 {
			sr.rc.faults.Add(1)
		}
	}
}

// moveLoop moves a random tenant to another server now and then (the
// first within 0.1 s), with a random grace, while the workers run; its
// cut-over checks the fence.
func (sr *srvRun) moveLoop(ctx context.Context, wg *sync.WaitGroup, r *rand.Rand, tenants []string) {
	defer wg.Done()
	wait := time.Duration(20+r.IntN(80)) * time.Millisecond // the first soon: CI's runs last a second
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = time.Duration(200+r.IntN(1500)) * time.Millisecond
		t := tenants[r.IntN(len(tenants))]
		sr.mu.Lock()
		from := sr.dir[t]
		sr.mu.Unlock()
		to := serverName(r.IntN(numServers))
		if to == from {
			continue
		}
		grace := []time.Duration{0, 5 * time.Millisecond, 50 * time.Millisecond, 500 * time.Millisecond}[r.IntN(4)]
		started := time.Now()
		err := sr.move(ctx, t, from, to, grace)
		// Move asks the servers on connections of their own, which a
		// tenant's hostile login role defaults there refuse too.
		if errors.Is(err, tenantdb.ErrRoleDefaultsChanged) && sr.roles.dirtyDuring([]string{from, to}, started, time.Now()) {
			sr.rc.countAccepted(err)
			continue
		}
		if err != nil && ctx.Err() == nil {
			sr.rc.violate(-1, fmt.Sprintf("Move of %s from %s to %s (grace %v): %v", t, from, to, grace, err))
		}
	}
}

func tenantIndex(t string) int {
	var i int
	fmt.Sscanf(t, "t%d", &i)
	return i
}

func serverIndex(s string) int {
	var i int
	fmt.Sscanf(s, "s%d", &i)
	return i
}

// move moves t from server from to server to. The cut-over checks on the
// old server that nothing of t runs there, reads the fence from its clock
// (rows of t stamped later there are violations, audit), updates the
// directory, and reads the new server's clock, from which t may run there.
func (sr *srvRun) move(ctx context.Context, t, from, to string, grace time.Duration) error {
	sr.pinned[t].Lock()
	defer sr.pinned[t].Unlock()
	w := &window{from: time.Now()}
	sr.mu.Lock()
	sr.mv[t] = append(sr.mv[t], w)
	sr.mu.Unlock()
	defer func() {
		sr.mu.Lock()
		w.to = time.Now()
		sr.mu.Unlock()
	}()
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	db := sr.db(t)
	err := sr.rc.pool.Move(mctx, t, tenantdb.Placement{Server: to, Database: db}, grace, func(ctx context.Context) error {
		old, nw := sr.se.admins[serverIndex(from)], sr.se.admins[serverIndex(to)]
		var n int
		var what string
		var fence time.Time
		if err := old.QueryRow(ctx, `select count(*), coalesce(string_agg(state || ' (backend started ' || (extract(epoch from clock_timestamp() - backend_start) * 1000)::int || ' ms ago): ' || left(query, 60), '; '), ''), clock_timestamp()
			from pg_stat_activity where datname = $1 and usename = $2 and state <> 'idle'`, db, loginRole).Scan(&n, &what, &fence); err != nil {
			return err
		}
		// Under servers-shared the database's other backends are other
		// tenants': there the audit's rows stamped after the fence judge it.
		if n > 0 && !sr.rc.cfg.sharedDB {
			sr.mu.Lock()
			faulted := !sr.flt[from].Before(w.from)
			sr.mu.Unlock()
			if !faulted { // a killed backend may show for a moment
				sr.rc.violate(-1, fmt.Sprintf("fence: at the cut-over of %s from %s to %s, %d of its backends still ran there: %s",
					t, from, to, n, what))
			}
		}
		var back time.Time
		if err := nw.QueryRow(ctx, "select clock_timestamp()").Scan(&back); err != nil {
			return err
		}
		sr.mu.Lock()
		defer sr.mu.Unlock()
		for _, o := range sr.off[[2]string{t, to}] {
			if o.to.IsZero() {
				o.to = back
			}
		}
		sr.off[[2]string{t, from}] = append(sr.off[[2]string{t, from}], &window{from: fence})
		sr.dir[t] = to
		sr.pos[t] = append(sr.pos[t], to)
		return nil
	})
	sr.mu.Lock()
	if err == nil {
		sr.moves++
	} else {
		sr.moveFails++
	}
	sr.mu.Unlock()
	return err
}

// sample checks, every 50 ms, each server's count of the pool's backends
// against its budget (a violation once it lasts a second), the Pool's own
// count, and each tenant's cap.
func (sr *srvRun) sample(ctx context.Context, wg *sync.WaitGroup, budget int, tenants []string) {
	defer wg.Done()
	over := make([]time.Time, numServers)
	for ctx.Err() == nil {
		for i, a := range sr.se.admins {
			var n int
			err := a.QueryRow(ctx, `select count(*) from pg_stat_activity
				where usename = $1 and backend_type = 'client backend'`, loginRole).Scan(&n)
			switch {
			case err != nil || n <= budget:
				over[i] = time.Time{}
			case over[i].IsZero():
				over[i] = time.Now()
			case time.Since(over[i]) > time.Second:
				sr.rc.violate(-1, fmt.Sprintf("server %s counted %d backends of the pool for over a second; its budget is %d",
					serverName(i), n, budget))
				over[i] = time.Time{}
			}
		}
		for _, s := range sr.rc.pool.ServersStat() {
			if s.Open > s.Budget || s.InUse > s.Budget {
				sr.rc.violate(-1, fmt.Sprintf("server %s: %d connections open, %d slots in use, budget %d", s.Server, s.Open, s.InUse, s.Budget))
			}
		}
		for _, t := range tenants {
			st := sr.rc.pool.TenantStat(t)
			if st.Limit > 0 && st.InUse > st.Limit {
				sr.rc.violate(-1, fmt.Sprintf("tenant %s holds %d connections, its cap is %d", t, st.InUse, st.Limit))
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// audit reads every server's record of the run: each row in its tenant's
// database, with its tenant's setting, and none stamped on a server while
// its tenant was moved away from it (after the fence, before the cut-over
// that brought it back).
func (sr *srvRun) audit(ctx context.Context, tenants []string) {
	dbs := map[string]string{srvShared: ""} // database -> its tenant, "" for any
	if !sr.rc.cfg.sharedDB {
		dbs = map[string]string{}
		for _, t := range tenants {
			dbs[srvDatabase(t)] = t
		}
	}
	for i, pg := range sr.se.pgs {
		s := serverName(i)
		for db, owner := range dbs {
			cfg, err := pgx.ParseConfig(pg.DSN)
			if err != nil {
				return
			}
			cfg.Database = db
			c, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				sr.rc.violate(-1, "audit: "+err.Error())
				continue
			}
			rows, err := c.Query(ctx, "select tenant, setting, at from calls where run = $1", sr.rc.runID)
			if err != nil {
				c.Close(ctx)
				sr.rc.violate(-1, "audit: "+err.Error())
				continue
			}
			for rows.Next() {
				var rt, setting string
				var at time.Time
				if err := rows.Scan(&rt, &setting, &at); err != nil {
					break
				}
				if owner != "" && rt != owner || setting != rt && setting != tag(rt) {
					sr.rc.violate(-1, fmt.Sprintf("server %s: a call of %s (setting %q) ran in database %s", s, rt, setting, db))
					continue
				}
				sr.mu.Lock()
				for _, w := range sr.off[[2]string{rt, s}] {
					if at.After(w.from) && (w.to.IsZero() || at.Before(w.to)) {
						sr.rc.violate(-1, fmt.Sprintf("fence: a call of %s ran on %s at %v, after its move away at %v",
							rt, s, at.Format("15:04:05.000000"), w.from.Format("15:04:05.000000")))
					}
				}
				sr.mu.Unlock()
			}
			rows.Close()
			c.Close(ctx)
		}
	}
}
