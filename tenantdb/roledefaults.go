package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// serverChecks is what the connect hook checks once per server, shared by
// the connections to it (and to its replicas): each server has its own
// catalog, so one server's login role defaults say nothing of another's,
// and only some may sit behind a pooler.
type serverChecks struct {
	defaults roleDefaults // the login role's defaults there, checked on every new connection
	probed   atomic.Bool  // whether a connection there was checked for a proxy
}

// roleDefaults guards against state that outlives every reset: the settings
// PostgreSQL gives each new session of the login role in its database. An
// ordinary role may change its own (ALTER ROLE CURRENT_USER [IN DATABASE
// d] SET search_path = ...), so one tenant's SQL, run as the shared login
// role, could put its schema first for every tenant on every connection
// opened after it, in its own database or another's, where DISCARD ALL
// restores that value rather than undoing it. The Pool's first connection
// to a server, opened before any tenant ran there, records the defaults of
// every database of that server; a later connection there whose database's
// differ is refused with ErrRoleDefaultsChanged until they are put back.
// Each server has its own (see serverChecks).
type roleDefaults struct {
	mu       sync.Mutex
	baseline map[string]string // guarded by mu; by database OID, "0" for a database created since; nil until read
	applied  map[string]string // guarded by mu; by database OID, what its first checked session took (sessionDefaults)
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

// sessionDefaults is the expression of the settings this session took
// from pg_db_role_setting when it started, as the server applied them. The
// catalog can change between the session's start and the check: a tenant
// that sets and resets a default in a loop would otherwise slip a session
// past a check of the catalog alone.
const sessionDefaults = `coalesce((select pg_catalog.string_agg(name operator(pg_catalog.||) '=' operator(pg_catalog.||) setting, E'\n' order by name)
	from pg_catalog.pg_settings where source operator(pg_catalog.=) any ('{global,database,user,"database user"}'::pg_catalog.text[])), '')`

// clientSettings is the expression of the names of the settings the
// client's startup parameters gave the session, which override the login
// role's defaults of the same names.
const clientSettings = `coalesce((select pg_catalog.string_agg(name, E'\n' order by name)
	from pg_catalog.pg_settings where source operator(pg_catalog.=) 'client'), '')`

// roleDefaultsQuery reads the current database's OID, its name, those
// settings and the ones the session took.
const roleDefaultsQuery = `select d.oid::pg_catalog.text, d.datname::pg_catalog.text, ` + roleSettings + `, ` + sessionDefaults +
	`, ` + clientSettings + `
from (select oid as db, oid, datname from pg_catalog.pg_database
	where datname operator(pg_catalog.=) pg_catalog.current_database()) d`

// check reads conn's defaults and compares them with the ones the Pool's
// first connection read for its database; the first connection reads those
// of every database, in the same round trip.
func (d *roleDefaults) check(ctx context.Context, conn *pgx.Conn) error {
	d.mu.Lock()
	baseline := d.baseline
	first := baseline == nil
	if first {
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
		} else if own := results[len(results)-1]; len(own.Rows) != 1 || len(own.Rows[0]) != 5 {
			err = errors.New("not one row of five columns for the current database")
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
	oid, database, settings, applied, client := string(own[0]), string(own[1]), string(own[2]), string(own[3]), string(own[4])
	recorded, ok := baseline[oid]
	if !ok {
		recorded = baseline["0"]
	}
	if settings != recorded {
		return fmt.Errorf("%w: database %q: %s", ErrRoleDefaultsChanged, database, settingsChange(recorded, settings))
	}
	if !slices.Equal(settingNames(applied), slices.DeleteFunc(settingNames(settings), func(name string) bool {
		return slices.Contains(settingNames(client), name)
	})) {
		return fmt.Errorf("%w: database %q: the session started with %q, the login role's defaults are %q",
			ErrRoleDefaultsChanged, database, applied, settings)
	}
	if !first {
		d.mu.Lock() // the first connection holds it already
		defer d.mu.Unlock()
	}
	if d.applied == nil {
		d.applied = map[string]string{}
	}
	was, seen := d.applied[oid]
	if !seen {
		d.applied[oid] = applied
		return nil
	}
	if applied != was {
		return fmt.Errorf("%w: database %q: the session started with %s", ErrRoleDefaultsChanged, database, settingsChange(was, applied))
	}
	return nil
}

// settingNames returns the sorted names of settings (name=value lines).
func settingNames(settings string) []string {
	if settings == "" {
		return nil
	}
	var names []string
	for _, l := range strings.Split(settings, "\n") {
		name, _, _ := strings.Cut(l, "=")
		names = append(names, strings.ToLower(name))
	}
	slices.Sort(names)
	return slices.Compact(names)
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
