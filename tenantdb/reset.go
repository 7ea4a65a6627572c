package tenantdb

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// resetStatements undo everything a session can carry from one holder to
// the next, as DISCARD ALL does (PgBouncer's default server_reset_query):
// cursors, the role and session authorization, every setting, LISTEN,
// session advisory locks, cached plans, temporary tables and views, sequence
// state. They are DISCARD ALL's own definition in the PostgreSQL docs less
// DEALLOCATE ALL, which pgx.Conn.DeallocateAll runs so that pgx's statement
// cache forgets the statements too. DISCARD ALL itself cannot share a
// multi-statement query with the next tenant's settings.
const resetStatements = "close all; set session authorization default; reset all; unlisten *; " +
	"select pg_advisory_unlock_all(); discard plans; discard temp; discard sequences"

// connTenantKey names, in a connection's pgconn CustomData, the tenant that
// last held it ("" for work on no tenant's behalf).
const connTenantKey = "tenantdb.tenant"

// resetSession readies conn for tenant and then runs statements (may be
// empty). A connection last held by another tenant is reset first: two
// round trips, and pgx prepares its statements again on their next use. A
// connection that stays with its tenant keeps its session, as a direct
// connection of that tenant would: only statements run. A new connection
// needs no reset. handover reports whether the connection changed tenant.
func resetSession(ctx context.Context, conn *pgx.Conn, tenant, statements string) (handover bool, err error) {
	data := conn.PgConn().CustomData()
	last, used := data[connTenantKey].(string)
	handover = used && last != tenant
	if handover {
		delete(data, connTenantKey) // until the reset is complete
		if err := conn.DeallocateAll(ctx); err != nil {
			return true, err
		}
		if statements == "" {
			statements = resetStatements
		} else {
			statements = resetStatements + "; " + statements
		}
	}
	if statements != "" {
		if _, err := conn.PgConn().Exec(ctx, statements).ReadAll(); err != nil {
			return handover, err
		}
	}
	if handover {
		dropNotifications(conn)
	}
	if !used || last != tenant {
		data[connTenantKey] = tenant // boxing allocates: only on a change
	}
	return handover, nil
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
