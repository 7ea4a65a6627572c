package tenantdb

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// resetStatements undo everything a session can carry from one holder to
// the next, as DISCARD ALL does (PgBouncer's default server_reset_query):
// cursors, the role and session authorization, every setting, LISTEN,
// session advisory locks, temporary tables and views, sequence state.
// Prepared statements are checked or deallocated apart (see
// statementsCheck). DISCARD PLANS is left out: a cached plan holds no
// tenant's data, and PostgreSQL plans a statement again when the role, row
// security or search_path it was planned under changes.
var resetStatements = []string{
	"close all",
	"set session authorization default",
	"reset all",
	"unlisten *",
	"select pg_catalog.pg_advisory_unlock_all()",
	"discard temp",
	"discard sequences",
}

// statementsCheck is the first statement of a reset. pgx keeps the
// statements it prepared from the application's SQL across a change of
// tenant (they hold no tenant's data, and preparing them again would cost a
// round trip each), so the reset proves that the server holds exactly those:
// named is how many pgx prepared and did not close, as counted on the wire.
// A holder's SQL can only add statements with PREPARE (from_sql, and
// possibly under one of pgx's names, to make the next tenant's pgx run its
// SQL) or drop some with DEALLOCATE or DISCARD ALL; either fails the check,
// the server skips the statement sent after it, and the connection is reset
// the slow way (slowReset). Statements pgx did not name through its cache
// fail it too. When pgx holds none, there is nothing to keep: every
// statement goes. It runs in the previous holder's session, so every name
// in it is qualified with pg_catalog: a temporary view (pg_temp comes before
// pg_catalog for relations) or a function or operator in a schema that its
// search_path puts first must not answer for the catalog's.
func statementsCheck(named int) string {
	if named == 0 {
		return "deallocate all"
	}
	n := strconv.Itoa(named)
	return "select case when pg_catalog.count(*) operator(pg_catalog.=) " + n +
		" and pg_catalog.count(*) filter (where from_sql or pg_catalog.left(name, 10) operator(pg_catalog.<>) 'stmtcache_')" +
		" operator(pg_catalog.=) 0 then 0 else pg_catalog.format('tenantdb: %s prepared statements, %s of them by SQL, where pgx prepared " + n + "'," +
		" pg_catalog.count(*), pg_catalog.count(*) filter (where from_sql))::int end from pg_catalog.pg_prepared_statement()"
}

// encodeStatements encodes statements as extended-protocol messages on the
// unnamed statement, without a Sync, and returns how many there are.
func encodeStatements(statements []string) ([]byte, int) {
	var buf []byte
	for _, sql := range statements {
		buf, _ = (&pgproto3.Parse{Query: sql}).Encode(buf)
		buf, _ = (&pgproto3.Bind{}).Encode(buf)
		buf, _ = (&pgproto3.Execute{}).Encode(buf)
	}
	return buf, len(statements)
}

// readySession readies conn for tenant, where values (may be empty) set
// its Session values. Nothing is sent here: the statements are armed on the
// connection's wire and travel with the next statement, or alone before a
// simple-protocol query (see wireConn). A connection last held by another
// tenant (or whose last reset never completed) is reset; a new one needs no
// reset; one that stays with its tenant keeps its session, as a direct
// connection of that tenant would, and gets values only.
func readySession(conn *pgx.Conn, tenant, values string) {
	w := wireOf(conn.PgConn().Conn())
	owner, owned, used := w.state()
	handover := used && (!owned || owner != tenant)
	var statements []string
	if handover {
		statements = append(statements, statementsCheck(w.namedStatements()))
		statements = append(statements, resetStatements...)
		dropNotifications(conn)
	}
	if values != "" {
		statements = append(statements, values)
	}
	if len(statements) == 0 {
		w.own(tenant)
		return
	}
	msgs, n := encodeStatements(statements)
	if handover || !owned {
		w.arm(msgs, n, tenant)
	} else {
		w.armValues(msgs, n, tenant)
	}
}

// slowReset resets conn for tenant in one round trip of its own, dropping
// every prepared statement with pgx's caches, and then runs values (may be
// empty): for a connection whose quick reset failed.
func slowReset(ctx context.Context, conn *pgx.Conn, tenant, values string) error {
	w := wireOf(conn.PgConn().Conn())
	if conn.PgConn().TxStatus() != 'I' {
		if _, err := conn.PgConn().Exec(ctx, "rollback").ReadAll(); err != nil {
			return err
		}
	}
	// DeallocateAll empties pgx's caches and, with a context that is
	// already done, sends nothing: the statement goes with the reset.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_ = conn.DeallocateAll(done)
	sql := "deallocate all"
	for _, s := range resetStatements {
		sql += "; " + s
	}
	if values != "" {
		sql += "; " + values
	}
	w.arm(nil, 0, tenant)
	if _, err := conn.PgConn().Exec(ctx, sql).ReadAll(); err != nil {
		return err
	}
	w.forgetStatements()
	dropNotifications(conn)
	w.own(tenant)
	return nil
}

// dropNotifications discards the notifications pgx has buffered on conn for
// the previous holder's LISTEN (received during its queries, or during the
// reset, before UNLISTEN took effect), which WaitForNotification would
// otherwise hand to the next one. With a context that is already done,
// WaitForNotification returns a buffered notification or, with none left,
// an error, without touching the connection.
func dropNotifications(conn *pgx.Conn) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		if _, err := conn.WaitForNotification(done); err != nil {
			return
		}
	}
}
