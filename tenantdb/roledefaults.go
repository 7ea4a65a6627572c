package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
)

// roleDefaults guards against state that outlives every reset: the settings
// PostgreSQL gives each new session of the login role in its database. An
// ordinary role may change its own (ALTER ROLE CURRENT_USER SET search_path
// = ...), so one tenant's SQL, run as the shared login role, could put its
// schema first for every tenant on every connection opened after it, where
// DISCARD ALL restores that value rather than undoing it. The first
// connection to each database records them; a later connection whose
// differ is refused with ErrRoleDefaultsChanged until they are put back.
type roleDefaults struct {
	mu    sync.Mutex
	first map[string]string // by database: the defaults its first connection found (as many as the server has databases)
}

// roleDefaultsQuery reads the current database and the settings of
// pg_db_role_setting that apply to a new session of the login role in it.
// Every name is qualified: the session's search_path is one of those
// settings.
const roleDefaultsQuery = `select pg_catalog.current_database()::pg_catalog.text,
	coalesce(pg_catalog.string_agg(pg_catalog.array_to_string(s.setconfig, E'\n'), E'\n' order by s.setrole, s.setdatabase), '')
from pg_catalog.pg_db_role_setting s
where (s.setrole operator(pg_catalog.=) 0::pg_catalog.oid
		or s.setrole operator(pg_catalog.=) (select r.oid from pg_catalog.pg_roles r where r.rolname operator(pg_catalog.=) session_user))
	and (s.setdatabase operator(pg_catalog.=) 0::pg_catalog.oid
		or s.setdatabase operator(pg_catalog.=) (select d.oid from pg_catalog.pg_database d
			where d.datname operator(pg_catalog.=) pg_catalog.current_database()))`

// check reads conn's defaults and compares them with the first ones seen
// for its database.
func (d *roleDefaults) check(ctx context.Context, conn *pgx.Conn) error {
	// On pgconn, below pgx's tracers: the user's sees only the user's
	// statements.
	results, err := conn.PgConn().Exec(ctx, roleDefaultsQuery).ReadAll()
	if err == nil && (len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) != 2) {
		err = errors.New("not one row of two columns")
	}
	if err != nil {
		return fmt.Errorf("tenantdb: read the login role's default settings: %w", err)
	}
	database, settings := string(results[0].Rows[0][0]), string(results[0].Rows[0][1])
	d.mu.Lock()
	defer d.mu.Unlock()
	first, seen := d.first[database]
	if !seen {
		if d.first == nil {
			d.first = map[string]string{}
		}
		d.first[database] = settings
		return nil
	}
	if settings != first {
		return fmt.Errorf("%w: database %q: %q when the pool opened its first connection, %q now",
			ErrRoleDefaultsChanged, database, first, settings)
	}
	return nil
}
