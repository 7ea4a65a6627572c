package tenantdb

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/internal/rejected"
)

// resetStatements undo, in one simple-protocol round trip, everything a
// session can carry from one holder to the next (PgBouncer's default
// server_reset_query, DISCARD ALL), except that pgx's own prepared
// statements stay: DISCARD ALL less DEALLOCATE ALL. RESET ALL goes first
// (DISCARD ALL runs it after SET SESSION AUTHORIZATION, which changes no
// setting it resets) so that a statement_timeout the holder left cannot cut
// the rest short: the server re-reads the setting at each statement. SET
// SESSION AUTHORIZATION DEFAULT also gives role its value at connection
// (as in DISCARD ALL, which has no RESET ROLE). Two reports follow, which
// readReset judges: the session's prepared statements, and the channels it
// listens on (which also releases every advisory lock). Each statement's
// cost to the server is in bench/results/README.md (issue 50).
const resetStatements = "reset all; " +
	"close all; " +
	"set session authorization default; " +
	"discard plans; " +
	"discard temp; " +
	"discard sequences; " +
	statementsReport + "; " +
	listeningReport + "; " +
	"unlisten *"

// statementsReport lists the session's prepared statements: their names,
// whether SQL prepared them, and their text.
const statementsReport = "select name, from_sql, statement from pg_catalog.pg_prepared_statement()"

// listeningReport releases the session's advisory locks and lists the
// channels it listens on, one row (an empty first column, then the
// channel) each. Both are in the select list, which the executor evaluates
// in order for its first row even when the channels give none; the same
// from a FROM clause costs the server 10,000 instructions more.
const listeningReport = "select pg_catalog.pg_advisory_unlock_all(), pg_catalog.pg_listening_channels()"

// The places of the reports among resetStatements' results: only UNLISTEN
// follows them.
var (
	statementsIndex = statementCount(resetStatements) - 3
	listeningIndex  = statementCount(resetStatements) - 2
)

// resetTimeout bounds the reset at release. A reset that takes longer (the
// holder left thousands of temporary objects, or something the reset needs
// is locked) fails, and its connection is closed: the holder's leftovers
// cost the holder's connection, never the next tenant's time.
const resetTimeout = 5 * time.Second

// connState is what tenantdb knows of a pooled connection's session, kept in
// its pgconn CustomData under stateKey. Only the connection's holder (or
// pgxpool's hooks, which run while no one holds it) touches it.
type connState struct {
	// tenant is the tenant the connection was last handed to ("" for work
	// on no tenant's behalf).
	tenant string
	// values is the ScopeSession statement the session was given last
	// ("" for none), so a tenant whose values it carries gets none again.
	values string
	// timed is whether values set a statement_timeout, which another
	// holder's values must then reset.
	timed bool
	// dirty is set once a holder may have changed the session (it ran a
	// statement, or had pgx's connection itself) and until a reset
	// succeeds: a dirty session is reset before anyone else gets it.
	dirty bool
	// statements are the names of the statements the server held for pgx
	// after the last reset, sorted and joined by commas, to tell when a
	// holder's SQL dropped some.
	statements string
	// forget is set when a holder's SQL may have dropped statements pgx
	// prepared since the last reset (it named DEALLOCATE): the next reset
	// drops them all, pgx's caches too.
	forget bool
	// life is the liveness record of the Conn that holds the connection
	// (see liveRef).
	life connLife
	// pc is the connection, set at creation, by which stateCache tells
	// its states apart.
	pc *pgconn.PgConn
	// setup is the session setup of the Pool whose holder has the
	// connection, set with its runner, for the release.
	setup *sessionSetup
}

// stateKey names the connState in a connection's pgconn CustomData.
const stateKey = "tenantdb.session"

// stateCache finds a connection's connState without the CustomData lookup
// (a hash of stateKey) that every acquire would pay twice, in prepare and
// for its runner: slot PID % len holds the state of the last connection
// first seen there, checked against its PgConn; a miss falls back to
// CustomData. pgxpool's BeforeClose (see install) and Hijack empty a
// connection's slot, so that the cache keeps no closed connection alive.
var stateCache [256]atomic.Pointer[connState]

// stateOf returns conn's connState, creating it for a connection tenantdb
// has not seen (pgxpool opened it before the hooks ran, or a test).
func stateOf(conn *pgconn.PgConn) *connState {
	slot := &stateCache[conn.PID()%uint32(len(stateCache))]
	if st := slot.Load(); st != nil && st.pc == conn {
		return st
	}
	data := conn.CustomData()
	st, ok := data[stateKey].(*connState)
	if !ok {
		st = &connState{pc: conn}
		data[stateKey] = st
		slot.Store(st)
	}
	return st
}

// forgetState empties conn's slot of stateCache, if it holds conn's state.
func forgetState(conn *pgconn.PgConn) {
	slot := &stateCache[conn.PID()%uint32(len(stateCache))]
	if st := slot.Load(); st != nil && st.pc == conn {
		slot.CompareAndSwap(st, nil)
	}
}

// prepare is the pgxpool PrepareConn hook: it hands conn to the tenant in ctx
// (no tenant: work on no tenant's behalf, with the defaults). A connection
// usually comes back reset at release (see release), carrying its last
// holder's ScopeSession values; it gets the tenant's values, in one round
// trip, only when it carries others. One whose reset was left for the next
// holder (the pool had callers waiting) is reset here, in the same round
// trip, when it changes tenant; the same tenant gets its own session back.
// An inline reset is bounded by resetTimeout. A reset that fails destroys
// the connection and pgxpool takes another; a failure of the tenant's own
// values (a role that does not exist) fails the call and keeps the
// connection, whose session is left as it was.
func (s *sessionSetup) prepare(ctx context.Context, conn *pgx.Conn) (bool, error) {
	st := stateOf(conn.PgConn())
	tenant, _ := TenantFrom(ctx)
	s.streak.acquired(tenant)
	timeout := statementTimeoutFrom(ctx)
	values, err := s.sessionValues(tenant, timeout)
	if err != nil {
		return true, err // nothing touched the connection: keep it
	}
	reset := st.dirty && st.tenant != tenant
	if !reset && values == st.values {
		st.tenant = tenant
		st.dirty = st.dirty || tenant == "" // work on no tenant's behalf has pgx's connection itself
		return true, nil
	}
	sql := values
	if !reset && st.timed && timeout <= 0 {
		// The last holder's values, which the reset at release gave the
		// session again, set a statement_timeout that these do not.
		if sql != "" {
			sql += "; "
		}
		sql += "reset statement_timeout"
	}
	if reset {
		sql = resetStatements
		if values != "" {
			sql += "; " + values
		}
	}
	bounded, cancel := context.WithTimeout(ctx, resetTimeout)
	defer cancel()
	results, err := conn.PgConn().Exec(bounded, sql).ReadAll()
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return false, fmt.Errorf("tenantdb: prepare the connection for tenant %q: %w", tenant, ctxErr)
		}
		if conn.IsClosed() || reset && len(results) <= statementCount(resetStatements) {
			return false, nil // the reset failed: another connection
		}
		// The values failed, and with them the implicit transaction they
		// ran in: the session is as it was, dirty or not.
		return true, fmt.Errorf("tenantdb: set the session values of tenant %q: %w", tenant, err)
	}
	if reset {
		if ok := s.readReset(bounded, conn, st, results); !ok {
			return false, nil
		}
		st.dirty = false
	}
	st.tenant, st.values, st.timed = tenant, values, timeout > 0 && values != ""
	st.dirty = st.dirty || tenant == ""
	return true, nil
}

// release returns c, which tenantdb held, to its pgxpool, resetting the
// session the holder leaves first when a statement may have changed it: on
// the holder's time and off the next tenant's path, in a goroutine of its
// own, as pgxpool runs an AfterRelease hook. pgxpool starts that goroutine
// at every release once a hook is set, which costs more than the rest of an
// acquire and release together; so tenantdb sets none (unless the
// pgxpool.Config has one of its own: then the reset runs in it, see
// install), and a connection no statement touched since its last reset goes
// back at once. The reset gives the session the holder's ScopeSession
// values again, so that the same tenant's next call needs no round trip.
// While calls wait for a connection, or with Config.Database while the
// holder's tenant has calls waiting at the gate (which Config.Affinity
// admits next, to this connection), the reset is left to the next holder
// (see prepare): one of them takes this connection at once, and needs the
// reset only if it is another tenant. A connection whose reset fails, takes
// longer than resetTimeout, or finds the session listening (pgx may have
// buffered a notification for the holder that no reset can take back) is
// closed before it goes back, and pgxpool destroys it, as it does a
// connection returned closed, busy or inside a transaction. st is c's
// connState, nil to look it up. resetting, if not nil, is told of a reset
// that runs after release returns, and its result called when it ended.
func (s *sessionSetup) release(c *pgxpool.Conn, st *connState, resetting func() func()) {
	if s == nil || s.inHook {
		c.Release()
		return
	}
	conn := c.Conn()
	if st == nil {
		st = stateOf(conn.PgConn())
	}
	if !s.resetDue(conn.PgConn(), st) {
		c.Release()
		return
	}
	ended := startReset(resetting)
	s.resets.Add(1) // before the slot goes back: see acquiring
	go func() {
		defer ended()
		s.resetOrClose(conn, st)
		c.Release()
		s.resets.Add(-1)
	}()
}

// startReset tells resetting (if not nil) of a reset starting, and
// returns what to call when it ended.
func startReset(resetting func() func()) func() {
	if resetting == nil {
		return func() {}
	}
	return resetting()
}

// returnConn is release for a connection that an adapter got from the
// pgxpool itself (Slot.Return): give calls release to return it.
func (s *sessionSetup) returnConn(conn *pgx.Conn, give func(), resetting func() func()) {
	if s.inHook {
		give()
		return
	}
	st := stateOf(conn.PgConn())
	if !s.resetDue(conn.PgConn(), st) {
		give()
		return
	}
	ended := startReset(resetting)
	s.resets.Add(1)
	go func() {
		defer ended()
		s.resetOrClose(conn, st)
		give()
		s.resets.Add(-1)
	}()
}

// resetDue reports whether a connection being released, with state st, is
// to be reset now (see release).
func (s *sessionSetup) resetDue(pc *pgconn.PgConn, st *connState) bool {
	if !st.dirty || pc.IsClosed() || pc.IsBusy() || pc.TxStatus() != 'I' {
		return false // nothing to reset, or pgxpool destroys it
	}
	if s.streak.only(st.tenant) || s.waiting != nil && s.waiting(st.tenant) {
		return false // reset by the next holder, if another tenant
	}
	return s.acquiring.Load() == 0 || s.idle == nil || s.idle() // else reset by the next holder, if another tenant
}

// streakLong is how many acquires in a row by one tenant make it the only
// tenant at work, for tenantStreak.
const streakLong = 4

// tenantStreak follows the tenant of a pool's acquires. While one tenant
// takes every connection (a service with one busy tenant, or a single
// tenant's burst), a reset at release would only give it its own session
// back: the release then leaves the connection to the next holder, whose
// prepare resets it if it is another tenant, in the same round trip as its
// values. A change of tenant ends the streak.
type tenantStreak struct {
	last atomic.Pointer[string]
	n    atomic.Int32
}

// acquired counts an acquire by tenant.
func (t *tenantStreak) acquired(tenant string) {
	if last := t.last.Load(); last != nil && *last == tenant {
		if t.n.Load() < streakLong {
			t.n.Add(1)
		}
		return
	}
	other := tenant // a copy, so that only a change of tenant allocates
	t.last.Store(&other)
	t.n.Store(0)
}

// only reports whether the last streakLong acquires were all by tenant.
func (t *tenantStreak) only(tenant string) bool {
	last := t.last.Load()
	return last != nil && *last == tenant && t.n.Load() >= streakLong
}

// resetOrClose resets conn's session, and closes conn when the reset fails.
func (s *sessionSetup) resetOrClose(conn *pgx.Conn, st *connState) {
	if s.reset(conn, st) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), resetTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}

// afterRelease is the pgxpool AfterRelease hook when the pgxpool.Config has
// one of its own (see install), which pgxpool runs in a goroutine of its own
// at every release, before the connection is back in the pool: it resets
// the session as release does, and reports false, for pgxpool to destroy
// the connection, when the reset fails.
func (s *sessionSetup) afterRelease(conn *pgx.Conn) bool {
	st := stateOf(conn.PgConn())
	if !s.resetDue(conn.PgConn(), st) {
		return true
	}
	return s.reset(conn, st)
}

// reset resets conn's session, whose state is st, and gives it st's
// ScopeSession values again. It reports false when the reset fails, takes
// longer than resetTimeout or finds the session listening.
func (s *sessionSetup) reset(conn *pgx.Conn, st *connState) bool {
	ctx, cancel := context.WithTimeout(context.Background(), resetTimeout)
	defer cancel()
	sql := resetStatements
	if st.values != "" {
		sql += "; " + st.values
	}
	results, err := conn.PgConn().Exec(ctx, sql).ReadAll()
	if err != nil || !s.readReset(ctx, conn, st, results) {
		return false
	}
	st.dirty = false
	return true
}

// acquire acquires a connection of pg, counted in acquiring while it may
// wait for one (see acquiring). It acquires again when pgxpool gave up
// because prepare refused every connection it tried (sessions left to
// their next holder that listened: see package rejected), so that one
// tenant's leftovers never fail another's call.
func (s *sessionSetup) acquire(ctx context.Context, pg *pgxpool.Pool) (*pgxpool.Conn, error) {
	if s.inHook || s.resets.Load() > 0 {
		s.acquiring.Add(1)
		defer s.acquiring.Add(-1)
	}
	for round := 1; ; round++ {
		c, err := pg.Acquire(ctx)
		if !rejected.Again(ctx, err, round) {
			return c, err
		}
	}
}

// readReset reads the report of resetStatements in results. When the
// holder prepared a statement that is not pgx's own (prepared from SQL, or
// under a name that is not pgx's for its text: pgx names a cached statement
// after the SHA-256 of its SQL, and a holder could put other SQL under that
// name), or dropped some of pgx's (DEALLOCATE), pgx's statement caches may
// name statements the server does not have or has under another text: every
// statement is dropped on both sides (DEALLOCATE ALL through pgx, which
// empties its caches), in one more round trip. It reports false for a
// session that still listened, or a failure.
func (s *sessionSetup) readReset(ctx context.Context, conn *pgx.Conn, st *connState, results []*pgconn.Result) bool {
	statements, listening := resetResult(results, statementsIndex, 3), resetResult(results, listeningIndex, 2)
	if statements == nil || listening == nil || len(listening.Rows) > 0 {
		return false // a failure, or a session that still listened
	}
	foreign := false
	names := make([]string, 0, len(statements.Rows))
	for _, row := range statements.Rows {
		name, fromSQL, text := string(row[0]), string(row[1]), row[2]
		if fromSQL != "f" || name != pgxStatementName(text) {
			foreign = true
		} else {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	kept := strings.Join(names, ",")
	if foreign || st.forget || !containsAll(kept, st.statements) {
		if err := conn.DeallocateAll(ctx); err != nil {
			return false
		}
		kept = ""
	}
	st.statements, st.forget = kept, false
	dropNotifications(conn)
	return true
}

// pgxStatementName is the name pgx's statement cache gives the statement of
// sql (pgx's internal stmtcache.StatementName).
func pgxStatementName(sql []byte) string {
	digest := sha256.Sum256(sql)
	return "stmtcache_" + hex.EncodeToString(digest[:24])
}

// containsAll reports whether the sorted, comma-joined names have every one
// of was.
func containsAll(names, was string) bool {
	for was != "" {
		var name string
		name, was, _ = strings.Cut(was, ",")
		for {
			var next string
			next, rest, found := strings.Cut(names, ",")
			if next == name {
				names = rest
				break
			}
			if !found || next > name {
				return false
			}
			names = rest
		}
	}
	return true
}

// resetResult returns the result at index of results if it is a SELECT
// whose rows have columns columns, or nil.
func resetResult(results []*pgconn.Result, index, columns int) *pgconn.Result {
	if len(results) <= index {
		return nil
	}
	r := results[index]
	if r.CommandTag.String() != "SELECT "+strconv.Itoa(len(r.Rows)) {
		return nil
	}
	for _, row := range r.Rows {
		if len(row) != columns {
			return nil
		}
	}
	return r
}

// statementCount counts the statements of sql, which tenantdb builds: one
// per semicolon outside quotes, plus the last.
func statementCount(sql string) int {
	n, quoted := 1, false
	for i := 0; i < len(sql); i++ {
		switch sql[i] {
		case '\'':
			quoted = !quoted
		case ';':
			if !quoted {
				n++
			}
		}
	}
	return n
}

// doneContext is a context that is already done, for the pgx calls that
// then return at once without a word to the server.
var doneContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// dropNotifications discards what pgx buffered on conn for a holder that
// listened and stopped during its hold: pgx's WaitForNotification hands out
// buffered notifications first and, with none left and a done context,
// returns without touching the connection.
func dropNotifications(conn *pgx.Conn) {
	for {
		if _, err := conn.WaitForNotification(doneContext); err != nil {
			return
		}
	}
}
