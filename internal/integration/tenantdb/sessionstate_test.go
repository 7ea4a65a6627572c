package tenantdb_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// bypassRole has BYPASSRLS and rlsRole is a member of it: SET ROLE to it
// reads every tenant's rows.
const bypassRole = "tenantdb_rls_bypass"

// setupSessionState is setupRLS plus what the session-state cases need: a
// role rlsRole may SET ROLE to that bypasses row-level security, and a
// sequence whose currval is session state.
func setupSessionState(t *testing.T) {
	t.Helper()
	setupRLS(t)
	admin, err := pgx.Connect(t.Context(), sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	_, err = admin.Exec(t.Context(), `
do $$ begin
	if not exists (select from pg_roles where rolname = '`+bypassRole+`') then
		create role `+bypassRole+` nologin bypassrls;
	end if;
end $$;
grant `+bypassRole+` to `+rlsRole+`;
grant select on rls_docs to `+bypassRole+`;
create sequence if not exists tenantdb_state_seq;
grant usage on sequence tenantdb_state_seq to `+rlsRole+`;
`)
	if err != nil {
		t.Fatal(err)
	}
}

// newStatePool is a tenantdb.Pool on one shared connection as rlsRole (or
// as the superuser), with Session's TenantSetting set or not. It has no
// SearchPath: search_path is the role's default unless someone sets it.
func newStatePool(t *testing.T, withSession, superuser bool) *tenantdb.Pool {
	t.Helper()
	pcfg := pgxConfig(t, sharedPG, 1)
	if !superuser {
		pcfg.ConnConfig.User, pcfg.ConnConfig.Password = rlsRole, "app"
	}
	var session tenantdb.Session
	if withSession {
		session.TenantSetting = "app.tenant_id"
	}
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 1}},
		Session: session,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// answer is what a request returned, or its error, as one comparable string.
func answer(row pgx.Row) string {
	var s string
	if err := row.Scan(&s); err != nil {
		return "error: " + err.Error()
	}
	return s
}

// backendPID is the PID of the server process behind the pool's one
// connection, read by tenant without running SQL.
func backendPID(t *testing.T, p *tenantdb.Pool, tenant string) uint32 {
	t.Helper()
	var pid uint32
	if err := p.AcquireFunc(as(tenant), func(c tenantdb.Conn) error { pid = c.Conn().PgConn().PID(); return nil }); err != nil {
		t.Fatal(err)
	}
	return pid
}

// stateCase is one kind of session state: tenant a leaves it with leave,
// then tenant b's request probe must answer as it did on the same
// connection before a's turn.
type stateCase struct {
	name      string
	superuser bool   // connect as the superuser, who may SET SESSION AUTHORIZATION
	leave     string // run by a with Exec (simple protocol: several statements allowed)
	probe     string // b's request, one text column
	// baseline, when set, is a substring b's answer must contain before
	// a's turn: the probe's sanity (it fails when the state is absent).
	baseline string
}

var stateCases = []stateCase{
	{
		name: "temp table shadowing a real table",
		leave: `create temp table rls_docs as select * from rls_docs;
			insert into rls_docs values ('a', 'a-temp')`,
		probe: "select coalesce(string_agg(tenant || ':' || body, ',' order by body), 'no rows') from rls_docs",
	},
	{
		name:     "WITH HOLD cursor",
		leave:    "declare c cursor with hold for select tenant || ':' || body from rls_docs union all select 'a-cursor'",
		probe:    "fetch all from c",
		baseline: `cursor "c" does not exist`,
	},
	{
		name:  "SET ROLE to a role with BYPASSRLS",
		leave: "set role " + bypassRole,
		probe: "select current_user || ' sees ' || (select count(*) from rls_docs) || ' rows'",
	},
	{
		name:      "SET SESSION AUTHORIZATION",
		superuser: true,
		leave:     "set session authorization " + rlsRole,
		probe:     "select session_user || ' as ' || current_user",
	},
	{
		name:  "a second custom setting",
		leave: "select set_config('app.user_id', 'a-user', false)",
		// Once set, a custom setting exists in the session for good: RESET
		// ALL (and DISCARD ALL) leave it '' rather than absent (NULL).
		// Only its value can leak.
		probe: "select coalesce(nullif(current_setting('app.user_id', true), ''), 'unset')",
	},
	{
		name: "statement_timeout",
		// Long enough never to cancel the reset itself (see "a
		// statement_timeout shorter than the reset" for that): b sees
		// the value.
		leave: "set statement_timeout = '10min'",
		probe: "select current_setting('statement_timeout')",
	},
	{
		// The server ends the session a millisecond after a's request:
		// b's request goes on another connection.
		name:  "idle_session_timeout",
		leave: "set idle_session_timeout = 1",
		probe: "select current_setting('idle_session_timeout')",
	},
	{
		name:  "search_path",
		leave: "set search_path = tenant_a, public",
		probe: "select current_setting('search_path') || ' finds items in ' || coalesce(to_regclass('items')::text, 'no schema')",
	},
	{
		name:     "prepared statement",
		leave:    "prepare p as select 'a-prepared'::text",
		probe:    "execute p",
		baseline: `prepared statement "p" does not exist`,
	},
	{
		name:     "sequence currval",
		leave:    "select nextval('tenantdb_state_seq')",
		probe:    "select currval('tenantdb_state_seq')::text",
		baseline: "not yet defined in this session",
	},
}

// TestSessionStateDoesNotCrossTenants: on one shared connection, whatever
// session state tenant a leaves behind, tenant b's next request answers as
// it would on a pristine connection, with Session set and unset. Each case
// starts on a new connection: b's request on it is the reference, then a
// leaves the state, then b runs the same request again (through pgx's
// statement cache, so the reset must also keep that cache honest).
//
// The reset happens when the connection changes tenant; the same tenant's
// next request may find its own state (see "same tenant again").
func TestSessionStateDoesNotCrossTenants(t *testing.T) {
	setupSessionState(t)
	for _, withSession := range []bool{true, false} {
		name := "Session unset"
		if withSession {
			name = "Session set"
		}
		t.Run(name, func(t *testing.T) {
			for _, tc := range stateCases {
				t.Run(tc.name, func(t *testing.T) {
					p := newStatePool(t, withSession, tc.superuser)
					before := answer(p.QueryRow(as("b"), tc.probe))
					if !strings.Contains(before, tc.baseline) {
						t.Fatalf("b's request on a fresh connection answered %q, want %q in it", before, tc.baseline)
					}
					pid := backendPID(t, p, "a")
					if _, err := p.Exec(as("a"), tc.leave); err != nil {
						t.Fatalf("a: %s: %v", tc.leave, err)
					}
					after := answer(p.QueryRow(as("b"), tc.probe))
					if after != before {
						t.Errorf("after a's %q, b's request answered %q; on a fresh connection %q", tc.leave, after, before)
					}
					if now := backendPID(t, p, "b"); now != pid {
						t.Logf("the connection was replaced between a and b (backend %d, then %d)", pid, now)
					}
					assertNothingHeld(t, p)
				})
			}
			t.Run("LISTEN, notified while b holds the connection", func(t *testing.T) {
				checkListen(t, newStatePool(t, withSession, false), false)
			})
			t.Run("LISTEN, notified before b's turn", func(t *testing.T) {
				checkListen(t, newStatePool(t, withSession, false), true)
			})
			t.Run("a statement_timeout shorter than the reset", func(t *testing.T) {
				// The reset, cancelled by a's timeout (or by a cancel its
				// expiry left pending), must not fail b's request: the
				// connection is destroyed and pgxpool tries another.
				checkShortTimeout(t, newStatePool(t, withSession, false))
			})
			t.Run("session advisory lock", func(t *testing.T) { checkAdvisoryLock(t, newStatePool(t, withSession, false)) })
			t.Run("pgx statement cache", func(t *testing.T) { checkStatementCache(t, newStatePool(t, withSession, false)) })
		})
	}
}

// checkListen: a LISTENs; a notification on a's channel must not reach b,
// whether it was sent before b acquired the connection (the server may have
// delivered it to the client's socket already, so the hand-over must also
// drop what pgx has queued) or while b holds it. b knows every earlier
// notification has been delivered when its own probe notification arrives:
// PostgreSQL delivers them in commit order.
func checkListen(t *testing.T, p *tenantdb.Pool, sendBeforeAcquire bool) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	notify := func(payload string) {
		t.Helper()
		if _, err := admin.Exec(ctx, "select pg_notify('tenantdb_a_chan', $1)", payload); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := p.Exec(as("a"), "listen tenantdb_a_chan"); err != nil {
		t.Fatal(err)
	}
	if sendBeforeAcquire {
		notify("sent before b acquired the connection")
	}
	c, err := p.Acquire(as("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if !sendBeforeAcquire {
		notify("sent while b holds the connection")
	}
	if _, err := c.Exec(ctx, "listen tenantdb_b_probe"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "notify tenantdb_b_probe, 'probe'"); err != nil {
		t.Fatal(err)
	}
	for {
		n, err := c.Conn().WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("b's own probe notification did not arrive: %v", err)
		}
		if n.Channel == "tenantdb_b_probe" {
			break
		}
		t.Errorf("b received a's notification on %s: %q", n.Channel, n.Payload)
	}
	c.Release()
	assertNothingHeld(t, p)
}

// checkShortTimeout: a leaves a statement_timeout of 1 ms, shorter than the
// reset's own round trips may take on a busy machine; b's request must not
// fail for it. A hand-over fails only when the reset happens to be slow, so
// it is tried many times.
func checkShortTimeout(t *testing.T, p *tenantdb.Pool) {
	failed := 0
	var first error
	const n = 200
	for range n {
		if _, err := p.Exec(as("a"), "set statement_timeout = 1"); err != nil {
			t.Fatal(err)
		}
		var s string
		if err := p.QueryRow(as("b"), "select 'ok'").Scan(&s); err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d requests of b failed after a set statement_timeout = 1 ms; the first: %v", failed, n, first)
	}
	assertNothingHeld(t, p)
}

// checkAdvisoryLock: a takes a session advisory lock; once b has had the
// connection, another connection can take the lock.
func checkAdvisoryLock(t *testing.T, p *tenantdb.Pool) {
	ctx := t.Context()
	if _, err := p.Exec(as("a"), "select pg_advisory_lock(4217)"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(as("b"), "select 1"); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	var free bool
	if err := admin.QueryRow(ctx, "select pg_try_advisory_lock(4217)").Scan(&free); err != nil {
		t.Fatal(err)
	}
	if !free {
		t.Fatal("a's session advisory lock is still held by the pool's connection after b's request")
	}
	if _, err := admin.Exec(ctx, "select pg_advisory_unlock(4217)"); err != nil {
		t.Fatal(err)
	}
	assertNothingHeld(t, p)
}

// checkStatementCache: pgx's cached prepared statements keep working when
// the connection changes tenant (and is reset) and when the same tenant
// comes back: no "prepared statement ... does not exist".
func checkStatementCache(t *testing.T, p *tenantdb.Pool) {
	const q = "select $1::int + (select count(*) from rls_docs)::int"
	for i, tenant := range []string{"a", "a", "b", "b", "a", "b", "a", "a"} {
		var n int
		if err := p.QueryRow(as(tenant), q, 10).Scan(&n); err != nil {
			t.Fatalf("request %d, tenant %s: %v", i, tenant, err)
		}
	}
	// The cached path was taken: pgx prepared q on the server.
	var prepared int
	err := p.QueryRow(as("a"), "select count(*)::int from pg_prepared_statements where statement = $1",
		pgx.QueryExecModeSimpleProtocol, q).Scan(&prepared)
	if err != nil {
		t.Fatal(err)
	}
	if prepared != 1 {
		t.Fatalf("%d prepared statements for the query, want 1: pgx's statement cache was not used", prepared)
	}

	// a drops every prepared statement behind pgx's back; b's cached
	// statement still works: the hand-over keeps the cache honest whatever
	// the previous holder did.
	if _, err := p.Exec(as("a"), "discard all"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := p.QueryRow(as("b"), q, 10).Scan(&n); err != nil {
		t.Fatalf("b, after a ran DISCARD ALL: %v", err)
	}
	assertNothingHeld(t, p)
}

// TestHandoverRefusesHijackedStatements: pgx's cache believes its
// statements exist across a change of tenant, so tenant a, whose SQL can run
// PREPARE, prepares its own under the name pgx gave a query of b's (named
// after the query's SHA-256). b's next request must run b's query, not a's:
// the reset drops a's statement, and pgx's is made again from pgx's own
// message.
func TestHandoverRefusesHijackedStatements(t *testing.T) {
	setupSessionState(t)
	const q = "select 'b asked for ' || $1::text"
	sum := sha256.Sum256([]byte(q))
	name := "stmtcache_" + hex.EncodeToString(sum[:24])
	for _, withSession := range []bool{false, true} {
		p := newStatePool(t, withSession, false)
		if got := answer(p.QueryRow(as("b"), q, "x")); got != "b asked for x" {
			t.Fatalf("b's first request answered %q", got)
		}
		var prepared bool
		err := p.QueryRow(as("b"), "select exists (select from pg_prepared_statements where name = $1 and not from_sql)", name).Scan(&prepared)
		if err != nil || !prepared {
			t.Fatalf("pgx did not prepare %s for b's query (%v): the test would prove nothing", name, err)
		}
		// pgx's statement stays across the reset: a drops it and puts its
		// own under the name, from SQL, and then by the protocol, as pgx
		// itself prepares (not from SQL).
		_, err = p.Exec(as("a"), `deallocate "`+name+`"; prepare "`+name+`" (text) as select 'a took over: ' || $1::text`)
		if err != nil {
			t.Fatal(err)
		}
		if got := answer(p.QueryRow(as("b"), q, "x")); got != "b asked for x" {
			t.Errorf("Session %v: after a replaced pgx's statement from SQL, b's request answered %q", withSession, got)
		}
		err = p.AcquireFunc(as("a"), func(c tenantdb.Conn) error {
			if _, err := c.Exec(as("a"), `deallocate "`+name+`"`); err != nil {
				return err
			}
			_, err := c.Conn().PgConn().Prepare(as("a"), name, "select 'a took over: ' || $1::text", nil)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := answer(p.QueryRow(as("b"), q, "x")); got != "b asked for x" {
			t.Errorf("Session %v: after a replaced pgx's statement, b's request answered %q", withSession, got)
		}
		// a's statement is gone, and pgx's works again for b.
		if got := answer(p.QueryRow(as("b"), "select count(*)::text from pg_prepared_statements where from_sql")); got != "0" {
			t.Errorf("Session %v: %s statements made by SQL left for b", withSession, got)
		}
		if got := answer(p.QueryRow(as("b"), q, "y")); got != "b asked for y" {
			t.Errorf("Session %v: b's next request answered %q", withSession, got)
		}
		assertNothingHeld(t, p)
	}
}

// TestHandoverUndoneByRollback: the reset of a change of tenant shares the
// transaction of the statement sent with it, so a statement that fails, or
// a transaction that rolls back, undoes it; the connection, though now the
// new tenant's, must then be reset again before that tenant's next request.
func TestHandoverUndoneByRollback(t *testing.T) {
	setupSessionState(t)
	const leave = "select set_config('app.user_id', 'a-user', false)"
	const probe = "select coalesce(nullif(current_setting('app.user_id', true), ''), 'unset')"
	undo := map[string]func(p *tenantdb.Pool) error{
		"a transaction rolled back": func(p *tenantdb.Pool) error {
			err := pgx.BeginFunc(as("b"), p, func(tx pgx.Tx) error { return errors.New("roll back") })
			if err == nil || err.Error() != "roll back" {
				return fmt.Errorf("BeginFunc: %v", err)
			}
			return nil
		},
		"a failed statement": func(p *tenantdb.Pool) error {
			if _, err := p.Exec(as("b"), "select 1 / $1::int", 0); err == nil {
				return errors.New("division by zero succeeded")
			}
			return nil
		},
		"a failed batch": func(p *tenantdb.Pool) error {
			b := &pgx.Batch{}
			b.Queue("select $1::int", 1)
			b.Queue("select 1 / $1::int", 0)
			if err := p.SendBatch(as("b"), b).Close(); err == nil {
				return errors.New("division by zero succeeded")
			}
			return nil
		},
	}
	for _, withSession := range []bool{false, true} {
		for name, f := range undo {
			t.Run(fmt.Sprintf("Session %v, %s", withSession, name), func(t *testing.T) {
				p := newStatePool(t, withSession, false)
				if err := f(p); err != nil { // pgx prepares b's statements: later the reset rides with them alone
					t.Fatal(err)
				}
				if _, err := p.Exec(as("a"), leave); err != nil {
					t.Fatal(err)
				}
				if err := f(p); err != nil {
					t.Fatal(err)
				}
				if got := answer(p.QueryRow(as("b"), probe)); got != "unset" {
					t.Errorf("after %s, b's next request saw a's setting: %q", name, got)
				}
				assertNothingHeld(t, p)
			})
		}
	}
}
