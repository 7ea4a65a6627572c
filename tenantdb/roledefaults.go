package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// roleDefaults guards against state that outlives every reset: the settings
// PostgreSQL gives each new session of the login role in its database. An
// ordinary role may change its own (ALTER ROLE CURRENT_USER [IN DATABASE
// d] SET search_path = ...), so one tenant's SQL, run as the shared login
// role, could put its schema first for every tenant on every connection
// opened after it, in its own database or another's, where DISCARD ALL
// restores that value rather than undoing it. The Pool's first connection,
// opened before any tenant ran, records the defaults of every database; a
// later connection whose database's differ is refused with
// ErrRoleDefaultsChanged until they are put back.
type roleDefaults struct {
	mu       sync.Mutex
	baseline map[string]string // guarded by mu; by database OID, "0" for a database created since; nil until read
}

// roleSettings is the expression of the settings of pg_db_role_setting that
// apply to a new session of the login role in the database of OID db. Every
// name is qualified: the session's search_path is one of those settings.
const roleSettings = `coalesce((select pg_catalog.string_agg(pg_catalog.array_to_string(s.setconfig, E'\n'), E'\n'
		order by s.setrole, s.setdatabase)
	from pg_catalog.pg_db_role_setting s
	where (s.setrole operator(pg_catalog.=) 0::pg_catalog.oid
			or s.setrole operator(pg_catalog.=) (select r.oid from pg_catalog.pg_roles r where r.rolname operator(pg_catalog.=) session_user))
		and (s.setdatabase operator(pg_catalog.=) 0::pg_catalog.oid or s.setdatabase operator(pg_catalog.=) db)), '')`

// roleBaselineQuery reads those settings for every database, and for OID 0
// those of a database without settings of its own.
const roleBaselineQuery = `select d.oid::pg_catalog.text, ` + roleSettings + `
from (select oid as db, oid from pg_catalog.pg_database union all select 0::pg_catalog.oid, 0::pg_catalog.oid) d`

// roleDefaultsQuery reads the current database's OID, its name and those
// settings.
const roleDefaultsQuery = `select d.oid::pg_catalog.text, d.datname::pg_catalog.text, ` + roleSettings + `
from (select oid as db, oid, datname from pg_catalog.pg_database
	where datname operator(pg_catalog.=) pg_catalog.current_database()) d`

// check reads conn's defaults and compares them with the ones the Pool's
// first connection read for its database; the first connection reads those
// of every database, in the same round trip.
func (d *roleDefaults) check(ctx context.Context, conn *pgx.Conn) error {
	d.mu.Lock()
	baseline := d.baseline
	if baseline == nil {
		defer d.mu.Unlock() // the connections opened with it wait for the baseline
	} else {
		d.mu.Unlock()
	}
	sql := roleDefaultsQuery
	if baseline == nil {
		sql = roleBaselineQuery + ";\n" + roleDefaultsQuery
	}
	// On pgconn, below pgx's tracers: the user's sees only the user's
	// statements.
	results, err := conn.PgConn().Exec(ctx, sql).ReadAll()
	if err == nil {
		if want := 1 + btoi(baseline == nil); len(results) != want {
			err = fmt.Errorf("%d results, want %d", len(results), want)
		} else if own := results[len(results)-1]; len(own.Rows) != 1 || len(own.Rows[0]) != 3 {
			err = errors.New("not one row of three columns for the current database")
		}
	}
	if err != nil {
		return fmt.Errorf("tenantdb: read the login role's default settings: %w", err)
	}
	if baseline == nil {
		baseline = make(map[string]string, len(results[0].Rows))
		for _, row := range results[0].Rows {
			if len(row) == 2 {
				baseline[string(row[0])] = string(row[1])
			}
		}
		d.baseline = baseline
	}
	own := results[len(results)-1].Rows[0]
	oid, database, settings := string(own[0]), string(own[1]), string(own[2])
	first, ok := baseline[oid]
	if !ok {
		first = baseline["0"]
	}
	if settings != first {
		return fmt.Errorf("%w: database %q: %s", ErrRoleDefaultsChanged, database, settingsChange(first, settings))
	}
	return nil
}

// settingsChange names the settings (name=value lines) of now that are not
// in was, and those of was that are gone.
func settingsChange(was, now string) string {
	lines := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, "\n")
	}
	wasL, nowL := lines(was), lines(now)
	var change []string
	for _, l := range nowL {
		if !slices.Contains(wasL, l) {
			change = append(change, "set "+l)
		}
	}
	for _, l := range wasL {
		if !slices.Contains(nowL, l) {
			change = append(change, "no longer "+l)
		}
	}
	if len(change) == 0 { // the same settings in another order
		return fmt.Sprintf("%q when the Pool opened its first connection, %q now", was, now)
	}
	return strings.Join(change, ", ")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
