package tenantdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// resetStatement undoes everything a session can carry from one holder to
// the next: cursors, the role and session authorization, every setting,
// LISTEN, session advisory locks, temporary tables and views, sequence
// state, cached plans and every prepared statement (PgBouncer's default
// server_reset_query). Sent first after a Sync, it commits at once (the
// server refuses it inside a transaction or behind another statement of the
// same pipeline). The statements pgx prepared are re-created by the wire on
// their next use, from pgx's own messages (see statements.go), so none that
// a holder's SQL prepared, or replaced under one of pgx's names, survives.
const resetStatement = "discard all"

// resetMessages is resetStatement encoded once: the wire only reads an
// armed prefix, so every connection can share it.
var resetMessages, _ = encodeStatements([]string{resetStatement})

// doneContext is a context that is already done, for the pgx calls that
// then return at once without a word to the server.
var doneContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

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
// connection of that tenant would, and gets its values again only when they
// are not the ones the session was given.
func readySession(conn *pgx.Conn, tenant, values string) {
	w := wireOf(conn.PgConn().Conn())
	owner, owned, used, carried := w.state()
	handover := used && (!owned || owner != tenant)
	if !handover && owned && values == carried {
		// The tenant's own session, set with these values: as on a
		// connection of its own, what it changed there it meets again.
		w.own(tenant)
		return
	}
	var msgs []byte
	n := 0
	if handover {
		if w.untrackedStatements() {
			forgetStatements(conn)
		}
		msgs, n = resetMessages[:len(resetMessages):len(resetMessages)], 1
		dropNotifications(conn)
	}
	if values != "" {
		more, _ := encodeStatements([]string{values})
		msgs, n = append(msgs, more...), n+1
	}
	if n == 0 {
		w.own(tenant)
		return
	}
	if handover || !owned {
		w.arm(msgs, n, tenant, values, handover)
	} else {
		w.armValues(msgs, n, tenant, values)
	}
}

// slowReset resets conn for tenant, and sets values (may be empty), in one
// round trip of its own: for a connection whose quick reset failed, or that
// is inside a transaction.
func slowReset(ctx context.Context, conn *pgx.Conn, tenant, values string) error {
	if conn.PgConn().TxStatus() != 'I' {
		if _, err := conn.PgConn().Exec(ctx, "rollback").ReadAll(); err != nil {
			return err
		}
	}
	w := wireOf(conn.PgConn().Conn())
	if w.untrackedStatements() {
		forgetStatements(conn)
	}
	statements := []string{resetStatement}
	if values != "" {
		statements = append(statements, values)
	}
	msgs, n := encodeStatements(statements)
	w.arm(msgs, n, tenant, values, true)
	if err := w.send(ctx); err != nil {
		return err
	}
	dropNotifications(conn)
	return nil
}

// forgetStatements empties pgx's statement caches without a word to the
// server: pgx prepares each statement again on its next use. A context that
// is already done makes DeallocateAll send nothing.
func forgetStatements(conn *pgx.Conn) {
	_ = conn.DeallocateAll(doneContext)
}

// dropNotifications discards the notifications pgx has buffered on conn for
// the previous holder's LISTEN (received during its queries, or during the
// reset, before UNLISTEN took effect), which WaitForNotification would
// otherwise hand to the next one. With a context that is already done,
// WaitForNotification returns a buffered notification or, with none left,
// an error, without touching the connection.
func dropNotifications(conn *pgx.Conn) {
	for {
		if _, err := conn.WaitForNotification(doneContext); err != nil {
			return
		}
	}
}
