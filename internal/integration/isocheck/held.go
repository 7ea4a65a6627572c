package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// pgCode is err's SQLSTATE, "" if it has none.
func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Holds ended by tenantdb (timelimits and timelimits-tx): the plan has a
// small IdleInTransactionTimeout and MaxHold, and one op in three, instead of
// its first statement, takes a Tx or a Conn, leaves things in it with
// tagged statements (SET LOCAL, set_config(..., false), SET, a temporary
// table, LISTEN, advisory locks, PREPARE, a cursor WITH HOLD, SET ROLE), and
// then idles past the idle timeout, or keeps working (or holds the Conn)
// past MaxHold. tenantdb then rolls back and releases the connection, the
// server session staying: a new way for a session to pass to the next
// holder, whose probe must see nothing of it. The ended holder's later calls
// must fail with ErrIdleInTransaction or ErrMaxHold (which match
// pgx.ErrTxClosed or ErrConnReleased), never run, and nothing else.

const (
	idleTimeout = 50 * time.Millisecond
	maxHold     = 200 * time.Millisecond
)

// heldKind is how a hold outlives its limits.
type heldKind int

const (
	heldNone     heldKind = iota
	heldTxIdle            // a Tx from Begin left idle
	heldTxBusy            // a Tx working (short statements) past MaxHold
	heldConnIdle          // a Conn held, outside any transaction, past MaxHold
	heldConnSQL           // a Conn with BEGIN sent as SQL, left idle
	heldSQLTx             // a database/sql Tx (tenantsql) left idle
	heldSQLConn           // a database/sql Conn (tenantsql) held past MaxHold
	heldRowsOpen          // a Conn past MaxHold with Rows open, which keep it busy until closed
	numHeldKinds
)

var heldNames = [...]string{"", "Tx left idle", "Tx working past MaxHold", "Conn held past MaxHold", "Conn with SQL BEGIN left idle", "sql.Tx left idle", "sql.Conn held past MaxHold",
	"Conn held past MaxHold with Rows open"}

func (k heldKind) String() string { return heldNames[k] }

// heldStmts are what a hold leaves in its session, each tagged.
var heldStmts = []string{
	"set local iso.tenant = '{tag}'",
	"select set_config('iso.tenant', '{tag}', false)",
	"set search_path = {tag}, public",
	"create temp table {tag}_held (n int)",
	"listen {tag}",
	"select pg_advisory_lock(4242, {n})",
	"select pg_advisory_xact_lock(4242, {n})",
	"prepare {tag}_hp as select 1",
	"declare {tag}_hc cursor with hold for select 1",
	"set role iso_{tag}",
	"select set_config('search_path', '{tag}_held_path, public', false)",
}

// heldSetRole is the bit of heldStmts' SET ROLE: the tenant's own later
// statements may meet the role, which may not read the temporary objects
// the login role made (42501, as the catalog's set-role says).
const heldSetRole = 1 << 9

// drawHeld draws a hold for o from r2.
func (o *op) drawHeld(r2 *rand.Rand) {
	o.held = heldKind(1 + r2.IntN(int(numHeldKinds)-1))
	o.heldSet = uint16(r2.IntN(1 << len(heldStmts)))
	o.heldWait = time.Duration(r2.IntN(200)) * time.Millisecond
}

// limitErr reports whether err is a time limit's end of a hold.
func limitErr(err error) bool {
	return errors.Is(err, tenantdb.ErrIdleInTransaction) || errors.Is(err, tenantdb.ErrMaxHold)
}

// sendHeld runs o's hold and returns the violations it saw: a call after
// the hold was ended that ran, or that failed with anything but the limit's
// error.
func (rc *runCtx) sendHeld(ctx context.Context, o op) []string {
	tenant := rc.env.tenants[o.tenant]
	h := &hostile{name: "held"}
	started := time.Now()
	rc.hostiles.Add(1)
	if o.heldSet&heldSetRole != 0 {
		rc.markSticky(tenant, "42501")
	}
	var bad []string
	ended := false
	aborted := false // a statement of its own failed: its transaction, if any, is aborted
	// judged judges err of one call of the hold: once a call failed with
	// the limit's error, every later one must fail so too.
	judged := func(what string, err error, own bool) {
		switch {
		case err != nil && limitErr(err):
			if !ended {
				rc.holdEnds.Add(1)
			}
			ended = true
		case ctx.Err() != nil && err != nil && (errors.Is(err, ctx.Err()) || errors.Is(err, sql.ErrTxDone) || errors.Is(err, sql.ErrConnDone)):
			// its context ended: database/sql then rolls its Tx back, or
			// closes its Conn, itself
		case ctx.Err() != nil && err != nil && !ended && connLost(err):
			// pgx closes a connection whose statement a context
			// interrupted: the holder's later calls find it closed. Not
			// after the hold was ended: those must not reach the connection.
		case ended:
			bad = append(bad, fmt.Sprintf("%s after the hold was ended: %v (want ErrIdleInTransaction or ErrMaxHold)", what, err))
		case aborted && (errors.Is(err, pgx.ErrTxCommitRollback) || pgCode(err) == "25P02"):
			// its own failed statement aborted the transaction
		default:
			var pgErr *pgconn.PgError
			if own && errors.As(err, &pgErr) {
				aborted = true
			}
			var hh *hostile
			if own {
				hh = h
			}
			if m := rc.judgeErr(ctx, tenant, err, own, hh, started); m != "" {
				bad = append(bad, what+": "+m)
			}
		}
	}
	var exec func(ctx context.Context, sql string) error
	var conn tenantdb.Conn // the Conn of heldRowsOpen
	var finish func()
	switch o.held {
	case heldTxIdle, heldTxBusy:
		tx, err := rc.pool.Begin(ctx)
		if err != nil {
			judged("Begin", err, false)
			return bad
		}
		exec = func(ctx context.Context, q string) error { _, err := tx.Exec(ctx, q); return err }
		finish = func() {
			judged("Commit", tx.Commit(ctx), false)
			if ended {
				judged("Rollback", tx.Rollback(ctx), false)
			}
		}
	case heldSQLTx:
		tx, err := rc.db.BeginTx(ctx, nil)
		if err != nil {
			judged("sql BeginTx", err, false)
			return bad
		}
		exec = func(ctx context.Context, q string) error { _, err := tx.ExecContext(ctx, q); return err }
		finish = func() {
			judged("sql Commit", tx.Commit(), false)
			tx.Rollback() // database/sql's Tx is done after Commit, whatever it returned: sql.ErrTxDone
		}
	case heldSQLConn:
		c, err := rc.db.Conn(ctx)
		if err != nil {
			judged("sql Conn", err, false)
			return bad
		}
		exec = func(ctx context.Context, q string) error { _, err := c.ExecContext(ctx, q); return err }
		finish = func() {
			if err := c.Close(); err != nil && !ended {
				judged("sql Conn Close", err, false)
			}
		}
	default:
		c, err := rc.pool.Acquire(ctx)
		if err != nil {
			judged("Acquire", err, false)
			return bad
		}
		conn = c
		exec = func(ctx context.Context, q string) error { _, err := c.Exec(ctx, q); return err }
		finish = func() {
			if !ended && o.held == heldConnSQL {
				judged("rollback", exec(ctx, "rollback"), false)
			}
			c.Release()
		}
		if o.held == heldConnSQL {
			judged("begin", exec(ctx, "begin"), false)
		}
	}
	for i, s := range heldStmts {
		if o.heldSet&(1<<i) == 0 {
			continue
		}
		q := hostile{sql: s}.render(tenant, o.tenant, "")
		judged(q, exec(ctx, q), true)
	}
	// The hold outlives its limit: idle, or working in short statements.
	switch o.held {
	case heldTxIdle, heldConnSQL, heldSQLTx:
		time.Sleep(2*idleTimeout + o.heldWait) // the holder forgets its transaction
	case heldConnIdle, heldSQLConn:
		time.Sleep(maxHold + o.heldWait) // the holder forgets its Conn
	case heldRowsOpen:
		// Rows left open keep the hold busy past MaxHold (docs/budgets.md);
		// their Close ends it.
		rows, err := conn.Query(ctx, "select generate_series(1, 3)")
		if err != nil {
			judged("Query", err, false)
			break
		}
		rows.Next()
		time.Sleep(maxHold + o.heldWait)
		rows.Close()
		judged("Rows", rows.Err(), false)
	case heldTxBusy:
		// Until an error: a statement of its own may have aborted the
		// transaction (25P02), or a fault ended the connection.
		for end := time.Now().Add(maxHold + o.heldWait); time.Now().Before(end); {
			err := exec(ctx, "select pg_sleep(0.01)")
			judged("select pg_sleep(0.01)", err, true)
			if err != nil {
				break
			}
		}
	}
	judged("select 1", exec(ctx, "select 1"), false)
	if ended {
		judged("select 1 again", exec(ctx, "select 1"), false)
	}
	finish()
	return bad
}
