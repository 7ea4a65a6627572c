package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// probeSQL is the statement every operation ends with: from the server's
// side, where the statement ran, as whom, with which values, and what it
// sees of what sessions leave behind. $1 is a nonce echoed back, so that a
// row that answers another statement is caught.
const probeSQL = `select $1::int,
 current_database()::text,
 current_user::text,
 session_user::text,
 coalesce(current_setting('iso.tenant', true), ''),
 current_setting('search_path'),
 coalesce((select string_agg(tenant, ',' order by tenant) from marker), ''),
 coalesce((select string_agg(name, ',' order by name) from pg_prepared_statements where name not like 'stmtcache%' and name not like 'lrupsc%'), ''),
 coalesce((select string_agg(name, ',' order by name) from pg_cursors), ''),
 coalesce((select string_agg(c, ',' order by c) from pg_listening_channels() c), ''),
 coalesce((select string_agg('evil_t' || objid, ',') from pg_locks where locktype = 'advisory' and pid = pg_backend_pid() and classid = 4242), ''),
 coalesce((select string_agg(relname, ',' order by relname) from pg_class where relnamespace = pg_my_temp_schema() and relname <> 'marker'), ''),
 concat_ws(',',
  case when current_setting('default_transaction_read_only') = 'on' then 'ro'
   when current_setting('transaction_read_only') = 'on' and not pg_is_in_recovery() then 'rt' end,
  case when current_setting('statement_timeout') <> '0' then 'st' end,
  case when current_setting('lock_timeout') <> '0' then 'lt' end,
  case when current_setting('idle_in_transaction_session_timeout') <> '0' then 'it' end,
  case when current_setting('idle_session_timeout') <> '0' then 'is' end),
 coalesce((select string_agg(tenant, ',' order by tenant) from rls_rows), ''),
 pg_is_in_recovery()::text,
 coalesce((extract(epoch from (select backend_start from pg_stat_activity where pid = pg_backend_pid())) * 1000)::bigint::text, '')`

// probeTextColumns counts the probe's text columns (all but the nonce).
const probeTextColumns = 15

// probeResult is one answer of the probe.
type probeResult struct {
	nonce                                                      int32
	database, user, session, setting, searchPath, marker       string
	prepared, cursors, listens, advisory, temps, stickyVisible string
	rls                                                        string // the rows of rls_rows it saw
	standby                                                    string // pg_is_in_recovery(): "true" on a replica
	backendStart                                               string // unix ms
}

func (r *probeResult) dest() []any {
	return []any{&r.nonce, &r.database, &r.user, &r.session, &r.setting, &r.searchPath, &r.marker,
		&r.prepared, &r.cursors, &r.listens, &r.advisory, &r.temps, &r.stickyVisible, &r.rls, &r.standby, &r.backendStart}
}

func (r probeResult) fields() [][2]string {
	return [][2]string{{"current_database", r.database}, {"current_user", r.user}, {"session_user", r.session},
		{"setting", r.setting}, {"search_path", r.searchPath}, {"marker", r.marker}, {"prepared", r.prepared},
		{"cursors", r.cursors}, {"listen", r.listens}, {"advisory", r.advisory}, {"temp", r.temps},
		{"state", r.stickyVisible}, {"rls", r.rls}}
}

// Behind a transaction pooler, what lives in the server connection's session
// outside any transaction reaches whichever client lands there next, and
// docs/session-state.md says so (advisory locks, LISTEN, WITH HOLD cursors,
// named prepared statements, temporary objects, session settings): the
// pooler configuration checks what the pins promise, not these.
var (
	poolerSessionFields = map[string]bool{"prepared": true, "cursors": true, "listen": true,
		"advisory": true, "temp": true, "state": true}
	poolerSessionErrors = map[string]bool{"57014": true, "25006": true, "55P03": true, "25P03": true,
		"26000": true, "42P05": true, "57P05": true}
)

var tagRE = regexp.MustCompile(`evil_t[0-9]+`)

// checkProbe returns what is wrong with r, the probe of tenant's statement
// with nonce: a leftover of another tenant anywhere, the wrong database or
// login, and, unless the tenant's own leftovers explain it, a value that is
// not the tenant's.
func (rc *runCtx) checkProbe(tenant string, nonce int32, r probeResult) []string {
	var bad []string
	if rc.inUndoRace(r.backendStart) {
		return nil
	}
	if r.nonce != nonce {
		bad = append(bad, fmt.Sprintf("the probe answered nonce %d, not %d", r.nonce, nonce))
	}
	own, foreign := false, false
	for _, f := range r.fields() {
		if rc.cfg.pooler && poolerSessionFields[f[0]] {
			continue // documented: no pin reaches the server session (docs/session-state.md)
		}
		for _, t := range tagRE.FindAllString(f[1], -1) {
			if t == tag(tenant) {
				own = true
				continue
			}
			foreign = true
			bad = append(bad, fmt.Sprintf("%s is %q: %s's leftover", f[0], f[1], strings.TrimPrefix(t, "evil_")))
		}
	}
	// Row-level security shows a tenant the row its setting names: its
	// own, or none (no setting, its own tag); never another's.
	if r.rls != "" && r.rls != tenant && !(own && strings.Contains(r.rls, tag(tenant))) {
		bad = append(bad, fmt.Sprintf("row-level security showed rows %q to %s", r.rls, tenant))
	}
	want := rc.cfg.expected(rc.env, tenant)
	sticky := rc.sticky(tenant)
	// A tenant that put its own SQL under pgx's statement names meets it
	// again when it gets its own session back (a reset left to the next
	// holder, who is the same tenant): its own tag, never another's.
	if r.database != want.database && !(own && strings.Contains(r.database, tag(tenant))) {
		bad = append(bad, fmt.Sprintf("ran in database %q, not %q", r.database, want.database))
	}
	// The same holds for its own SET SESSION AUTHORIZATION: while one
	// tenant takes every connection, releases leave the reset to the next
	// holder (tenantdb/release.go's tenantStreak).
	if r.session != want.session && !sticky["sa"] && !(own && strings.Contains(r.session, tag(tenant))) {
		bad = append(bad, fmt.Sprintf("session_user is %q, not %q", r.session, want.session))
	}
	if !own && !foreign && !sticky["sa"] {
		if r.user != want.user {
			bad = append(bad, fmt.Sprintf("ran as %q, not %q", r.user, want.user))
		}
		if r.setting != want.setting {
			bad = append(bad, fmt.Sprintf("%s is %q, not %q", settingKey, r.setting, want.setting))
		}
		if normPath(r.searchPath) != want.searchPath {
			bad = append(bad, fmt.Sprintf("search_path is %q, not %q", r.searchPath, want.searchPath))
		}
		if r.marker != want.marker {
			bad = append(bad, fmt.Sprintf("marker shows %q, not %q", r.marker, want.marker))
		}
	}
	if r.stickyVisible != "" && !rc.cfg.pooler {
		for _, s := range strings.Split(r.stickyVisible, ",") {
			if !sticky[s] && !strings.Contains(s, tag(tenant)) {
				bad = append(bad, fmt.Sprintf("session state %q that %s never set", s, tenant))
			}
		}
	}
	return bad
}

// judgeErr returns "" when err is acceptable for a statement of tenant run
// with ctx: the statement's own (hostileOwn: any server error of a hostile
// statement), a documented tenantdb error, the tenant's own sticky state, or
// the context's error once the context ended. Anything else (a raw
// "i/o timeout", another statement's SQLSTATE) is a violation.
func (rc *runCtx) judgeErr(ctx context.Context, tenant string, err error, hostileOwn bool, h *hostile, started time.Time) string {
	if err == nil {
		return ""
	}
	m := rc.judge(ctx, tenant, err, hostileOwn, h, started)
	if m == "" && !hostileOwn {
		rc.countAccepted(err)
	}
	return m
}

// countAccepted counts the accepted errors of non-hostile statements by
// kind, for the report: a run whose operations mostly fail checks little.
func (rc *runCtx) countAccepted(err error) {
	k := err.Error()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		k = "SQLSTATE " + pgErr.Code
	} else if len(k) > 160 {
		k = k[:160]
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.accepted == nil {
		rc.accepted = map[string]int{}
	}
	rc.accepted[k]++
}

func (rc *runCtx) judge(ctx context.Context, tenant string, err error, hostileOwn bool, h *hostile, started time.Time) string {
	if errors.Is(err, tenantdb.ErrOverLimit) || errors.Is(err, tenantdb.ErrRoleDefaultsChanged) ||
		errors.Is(err, tenantdb.ErrTooManyDatabases) || errors.Is(err, tenantdb.ErrRevoked) {
		return ""
	}
	var pgErr *pgconn.PgError
	isPg := errors.As(err, &pgErr)
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return ""
		}
		if isPg && pgErr.Code == "57014" && strings.Contains(pgErr.Message, "user request") {
			return "" // the cancel request of the ended context won the race
		}
	}
	if m, ok := rc.judgeReplica(ctx, err, started); ok {
		return m
	}
	if rc.cfg.holdLimits && limitErr(err) {
		return "" // tenantdb ended the hold: IdleInTransactionTimeout or MaxHold (held.go)
	}
	if isPg && rc.sticky(tenant)[pgErr.Code] {
		return ""
	}
	if isPg && rc.cfg.pooler && poolerSessionErrors[pgErr.Code] {
		return "" // another client's session setting on the server connection: documented
	}
	if isPg && pgErr.Code == "25P02" && hostileOwn {
		return ""
	}
	if h != nil {
		if h.name == "terminate-own-backend" {
			return ""
		}
		if h.notInTx && errors.Is(err, tenantdb.ErrCannotRunInTransaction) {
			return ""
		}
		if isPg && hostileOwn && pgErr.Code != "26000" && pgErr.Code != "08P01" {
			return ""
		}
	}
	if rc.cfg.database && rc.droppedSince(tenant, started) && (missingDatabase(err) || connLost(err)) {
		return "" // its database was dropped meanwhile (dbfault.go)
	}
	if rc.cfg.failClosed && redisRefused(err) && (rc.redisCutSince(started) || rc.redisSlow()) {
		return "" // FailClosed while Redis was cut off, or too slow to answer (redisfault.go)
	}
	if rc.cfg.database && connectTimedOut(err) && !callStart(ctx).IsZero() && time.Since(callStart(ctx)) >= connectTimeout {
		// A connect that used all of its connect_timeout (the server or the
		// budget was slow): a failed connect, documented. One that fails
		// sooner replays an earlier failure (issue 51, 7).
		return ""
	}
	if rc.cfg.pooler && (connLost(err) || strings.Contains(err.Error(), "connection refused")) {
		// PgBouncer itself may be gone (its bug, bouncer.go): started
		// again, a fault; if it cannot be, the run stops and says so.
		if !rc.reviveBouncer() {
			return ""
		}
	}
	if rc.faultSince(started) && connLost(err) {
		return "" // a fault of the checker's own ended the backend or the connection
	}
	if rc.cfg.pooler && isPg && pgErr.Code == "57P01" {
		// A backend the fault loop or a tenant's terminate-own-backend ended
		// while PgBouncer held it: PgBouncer hands the server connection out
		// later, and its FATAL reaches whichever client's statement comes
		// first, beyond the window above. Nothing else here ends backends.
		return ""
	}
	return fmt.Sprintf("unexpected error: %v", err)
}

// connectTimeout is the connect_timeout of the Config.Database configurations.
const connectTimeout = 3 * time.Second

// connectTimedOut reports whether err is a connect that timed out.
func connectTimedOut(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) && (errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timeout"))
}

type callStartKey struct{}

// callStart is when the call whose context is ctx began (adapters.go sets
// it for each phase), zero if unknown.
func callStart(ctx context.Context) time.Time {
	t, _ := ctx.Value(callStartKey{}).(time.Time)
	return t
}

// connLost reports whether err says the connection or its backend ended,
// as a fault makes it: not a timeout, which only a context may cause.
func connLost(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57P01" || pgErr.Code == "57P05" || strings.HasPrefix(pgErr.Code, "08")
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) && !errors.Is(err, tenantdb.ErrConnReleased) &&
		!errors.Is(err, tenantdb.ErrIdleInTransaction) && !errors.Is(err, tenantdb.ErrMaxHold) {
		// database/sql's, from a sql.Tx or sql.Conn whose connection a
		// fault ended: ErrBadConn, then ErrConnDone for the closed sql.Conn
		// (held.go); not tenantsql's ErrConnDone of an ended hold.
		return true
	}
	m := err.Error()
	for _, s := range []string{"EOF", "conn closed", "connection reset", "broken pipe", "closed the connection", "closed pool", "conn busy"} {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// sampler watches the server's count of the pools' backends and the tenants'
// stats while a run goes on.
type sampler struct {
	rc    *runCtx
	admin *pgxpool.Pool
	limit int
}

// run samples every 50 ms until ctx ends. The server may show a backend
// for a moment after the client closed it; a count over the limit is a
// violation once it lasts a second.
func (s *sampler) run(ctx context.Context, wg *sync.WaitGroup) {
	defer wg.Done()
	var overSince, replicaOver time.Time
	maxSeen := 0
	for ctx.Err() == nil {
		var n int
		err := s.admin.QueryRow(ctx, `select count(*) from pg_stat_activity
			where usename = $1 and backend_type = 'client backend'`, loginRole).Scan(&n)
		if err == nil {
			if n > s.limit {
				maxSeen = max(maxSeen, n)
				if overSince.IsZero() {
					overSince = time.Now()
				} else if time.Since(overSince) > time.Second {
					s.rc.violate(-1, fmt.Sprintf("the server counted %d backends of the pool for over a second (up to %d), the limit is %d", n, maxSeen, s.limit))
					overSince = time.Time{}
				}
			} else {
				overSince, maxSeen = time.Time{}, 0
			}
		}
		s.rc.sampleReplica(ctx, &replicaOver, s.limit)
		s.rc.adapters.check(s.rc)
		for _, t := range s.rc.env.tenants {
			st := s.rc.pool.TenantStat(t)
			if st.Limit > 0 && st.InUse > st.Limit {
				s.rc.violate(-1, fmt.Sprintf("tenant %s holds %d connections, its cap is %d", t, st.InUse, st.Limit))
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkNothingHeld is the end of a run: no slot in use or waiting, no
// connection acquired, in any database.
func (rc *runCtx) checkNothingHeld() {
	deadline := time.Now().Add(15 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		st := rc.pool.Stat()
		last = ""
		if st.Tenants.InUse != 0 || st.Tenants.Waiting != 0 {
			last = fmt.Sprintf("%d tenant slots in use, %d waiting", st.Tenants.InUse, st.Tenants.Waiting)
		} else if st.AcquiredConns() != 0 {
			last = fmt.Sprintf("%d connections acquired", st.AcquiredConns())
		} else {
			for _, d := range rc.pool.AppendDatabaseStat(nil) {
				if d.InUse != 0 {
					last = fmt.Sprintf("%d connections of database %s in use", d.InUse, d.Database)
				}
			}
		}
		if last == "" {
			return
		}
		time.Sleep(50 * time.Millisecond) // polling the pool's own stats, not synchronising
	}
	rc.violate(-1, "at the end: "+last)
}

// audit checks the rows the run wrote: each in its tenant's database, as its
// tenant's role or its own leftover role, and none of a tenant's in the
// template database when each tenant has its own.
func (rc *runCtx) audit(ctx context.Context) {
	rows, err := rc.adminPool.Query(ctx, "select tenant, db, usr from items where n = $1", rc.runID)
	if err != nil {
		rc.violate(-1, "audit: "+err.Error())
		return
	}
	defer rows.Close()
	for rows.Next() {
		var t, db, usr string
		if err := rows.Scan(&t, &db, &usr); err != nil {
			return
		}
		if rc.cfg.database {
			rc.violate(-1, fmt.Sprintf("tenant %s's row landed in the template database %s (as %s)", t, db, usr))
			continue
		}
		for _, tg := range tagRE.FindAllString(usr, -1) {
			if tg != tag(t) {
				rc.violate(-1, fmt.Sprintf("tenant %s's row was written as %s", t, usr))
			}
		}
	}
}

// auditDatabases checks, with a database per tenant, that every row of the
// run in a tenant's database is that tenant's.
func (rc *runCtx) auditDatabases(ctx context.Context) {
	if !rc.cfg.database {
		return
	}
	for _, t := range rc.env.tenants {
		cfg, err := pgx.ParseConfig(rc.env.pg.DSN)
		if err != nil {
			return
		}
		cfg.Database = tenantDatabase(t)
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			rc.violate(-1, "audit: "+err.Error())
			continue
		}
		var others string
		err = c.QueryRow(ctx, "select coalesce(string_agg(distinct tenant, ','), '') from items where n = $1 and tenant <> $2",
			rc.runID, t).Scan(&others)
		c.Close(ctx)
		if err == nil && others != "" {
			rc.violate(-1, fmt.Sprintf("rows of tenants %s landed in %s's database", others, t))
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
