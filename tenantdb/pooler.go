package tenantdb

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// defaultPathKey names, in a connection's pgconn CustomData, the
// search_path ScopeTransaction pins for a tenant without one of its own:
// the login role's default with pg_temp last, learned when the connection
// was opened.
const defaultPathKey = "tenantdb.defaultPath"

// connect is the pgxpool AfterConnect hook of the connections to one server,
// whose checks are server's. It checks the login role's default settings
// against the server's first connection's (see roleDefaults), in one
// round trip per new connection. Under ScopeTransaction it learns, in one
// round trip per new connection, the login role's default search_path: its reset value,
// which a session-level SET cannot change, since behind a transaction
// pooler a new client connection can land on a server connection whose
// session another client changed. Under
// ScopeSession with something to set, the server's first connection checks
// whether a proxy stands between it and the server, and warns that
// ScopeSession needs session pooling there.
func (s *sessionSetup) connect(ctx context.Context, conn *pgx.Conn, server *serverChecks) error {
	if err := server.defaults.check(ctx, conn); err != nil {
		return err
	}
	if s.transactional() {
		var path string
		// The operator is named by schema: behind a transaction pooler
		// the session may be another client's, whose search_path can put
		// another "=" first.
		err := conn.QueryRow(ctx, "select reset_val from pg_catalog.pg_settings "+
			"where name operator(pg_catalog.=) 'search_path'", pgx.QueryExecModeSimpleProtocol).Scan(&path)
		if err != nil {
			return fmt.Errorf("tenantdb: read the login role's default search_path: %w", err)
		}
		conn.PgConn().CustomData()[defaultPathKey] = tempLast(path)
		return nil
	}
	if s.cfg.Scope != ScopeSession || !sessionEnabled(&s.cfg) || server.probed.Swap(true) {
		return nil
	}
	proxied, pid, err := behindProxy(ctx, conn)
	if err != nil {
		// A broken connection, which its first use will find: the next
		// connection checks instead, and no connect fails for the check.
		server.probed.Store(false)
		return nil
	}
	if proxied {
		s.logger.Warn("tenantdb: the connections go through a pooler or proxy (the server's process ID differs from the one "+
			"the connection was given at start): Session with ScopeSession keeps tenants apart only if it pools sessions "+
			"(PgBouncer pool_mode=session); behind a transaction pooler use ScopeTransaction",
			"server_pid", pid, "connection_pid", conn.PgConn().PID())
	}
	return nil
}

// behindProxy reports whether conn reaches PostgreSQL through a pooler or
// proxy: the process ID the server reports differs from the one conn was
// given at start, which a proxy such as PgBouncer makes up for its clients.
// It returns the server's process ID.
func behindProxy(ctx context.Context, conn *pgx.Conn) (bool, uint32, error) {
	var pid uint32
	err := conn.QueryRow(ctx, "select pg_catalog.pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid)
	return err == nil && pid != conn.PgConn().PID(), pid, err
}

// tempLast returns the search_path list path with pg_temp moved to its end,
// where a temporary table cannot shadow a real one (PostgreSQL searches
// pg_temp first when a path does not name it).
func tempLast(path string) string {
	var kept []string
	for _, name := range splitPath(path) {
		if name != "" && !strings.EqualFold(name, "pg_temp") && name != `"pg_temp"` {
			kept = append(kept, name)
		}
	}
	return strings.Join(append(kept, "pg_temp"), ", ")
}

// splitPath splits a search_path value at the commas outside double
// quotes, trimming the spaces around each name.
func splitPath(path string) []string {
	var names []string
	quoted, start := false, 0
	for i := 0; i < len(path); i++ {
		switch path[i] {
		case '"':
			quoted = !quoted // a doubled quote toggles twice
		case ',':
			if !quoted {
				names = append(names, strings.TrimSpace(path[start:i]))
				start = i + 1
			}
		}
	}
	return append(names, strings.TrimSpace(path[start:]))
}
