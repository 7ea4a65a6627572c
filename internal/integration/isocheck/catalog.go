package main

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"
)

// hostile is one statement a tenant's own SQL may send to leave something
// behind in its session, or to break it. Its SQL may use {tag} (evil_<tenant>,
// which every value it leaves carries, so the invariants can tell whose a
// leftover is), {tenant}, {n} (the tenant's number), {otherdb} (another
// tenant's database), {login} (the pools' login role) and {stmt} (the name
// pgx gives the probe's prepared statement).
//
// To add a hostile statement, add an entry: the invariants check after every
// operation that its leftovers reach no other tenant.
type hostile struct {
	name string
	sql  string
	// sticky names the session state the statement changes that carries no
	// tag (a timeout, read-only): the tenant's own later statements may fail
	// with these SQLSTATEs, and its probe may show the state, while it could
	// still be on that session; another tenant's must not.
	sticky []string
	// roleDefaults marks an ALTER ROLE ... SET, which outlives sessions: the
	// checker undoes it a few operations later.
	roleDefaults bool
	// notInTx: the statement cannot run inside a transaction block; under
	// ScopeTransaction its failure (25001) is its own.
	notInTx bool
	// endsSession marks a leftover that ends the session later on its own:
	// as with a backend the checker kills, the calls that meet the dead
	// connection within seconds may fail (or retry; in the tenant's database).
	endsSession bool
	// cut bounds the statement's context: a long statement whose deadline
	// ends it early, so that its cancel request must go out (and reach the
	// server) while the budget is in use.
	cut time.Duration
}

// catalog is every hostile statement the workload draws from.
var catalog = []hostile{
	{name: "set-setting", sql: "set iso.tenant = '{tag}'"},
	{name: "set_config", sql: "select set_config('iso.tenant', '{tag}', false)"},
	{name: "set-search_path", sql: "set search_path = {tag}, public"},
	{name: "pg_temp-first", sql: "set search_path = pg_temp, {tag}, public"},
	{name: "temp-table-shadow", sql: "create temp table marker as select '{tag}'::text as tenant"},
	{name: "temp-view-shadow", sql: "create temp view marker as select '{tag}'::text as tenant"},
	{name: "temp-table", sql: "create temp table {tag}_tmp (n int)"},
	// Its own later statements may meet the role (a tenant gets its own
	// session back after a streak: tenantdb/release.go), which may not read
	// the temporary objects the login role made in that session (42501).
	{name: "set-role", sql: "set role iso_{tag}", sticky: []string{"42501"}},
	{name: "set-session-authorization", sql: "set session authorization {login}", sticky: []string{"sa"}},
	{name: "prepare", sql: "prepare {tag}_p as select 1"},
	{name: "prepare-pgx-name", sql: "prepare {stmt} (int) as select $1, " + tagColumns, sticky: []string{"42P05"}},
	{name: "deallocate-all", sql: "deallocate all", sticky: []string{"26000"}},
	{name: "deallocate-all-prepare-pgx-name", sql: "deallocate all; prepare {stmt} (int) as select $1, " + tagColumns, sticky: []string{"26000", "42P05"}},
	{name: "cursor-with-hold", sql: "declare {tag}_c cursor with hold for select 1"},
	{name: "listen", sql: "listen {tag}"},
	{name: "notify", sql: "notify {tag}, 'x'"},
	{name: "advisory-lock", sql: "select pg_advisory_lock(4242, {n})"},
	{name: "advisory-xact-lock", sql: "select pg_advisory_xact_lock(4242, {n})"},
	{name: "read-only-characteristics", sql: "set session characteristics as transaction read only", sticky: []string{"25006", "ro"}},
	{name: "default-read-only", sql: "set default_transaction_read_only = on", sticky: []string{"25006", "ro"}},
	{name: "statement_timeout-tiny", sql: "set statement_timeout = 1", sticky: []string{"57014", "st"}},
	{name: "lock_timeout-tiny", sql: "set lock_timeout = 1", sticky: []string{"55P03", "lt"}},
	{name: "idle-in-tx-timeout-tiny", sql: "set idle_in_transaction_session_timeout = 1", sticky: []string{"25P03", "it"}, endsSession: true},
	{name: "alter-role-set", sql: "alter role current_user set search_path = {tag}, public", roleDefaults: true},
	{name: "alter-role-read-only", sql: "alter role current_user set default_transaction_read_only = on", roleDefaults: true},
	{name: "alter-role-in-database", sql: "alter role current_user in database {otherdb} set search_path = {tag}, public", roleDefaults: true},
	{name: "alter-role-in-database-read-only", sql: "alter role current_user in database {otherdb} set default_transaction_read_only = on", roleDefaults: true},
	{name: "idle_session_timeout-tiny", sql: "set idle_session_timeout = 100", sticky: []string{"is"}, endsSession: true},
	{name: "terminate-own-backend", sql: "select pg_terminate_backend(pg_backend_pid())"},
	{name: "sleep-long", sql: "select pg_sleep(3)"},
	{name: "sleep-cut", sql: "select pg_sleep(20)", cut: 300 * time.Millisecond},
	{name: "error-in-statement", sql: "select 1/0"},
	{name: "syntax-error", sql: "selec 1"},
	{name: "vacuum", sql: "vacuum marker", notInTx: true},
}

// tagColumns are the probe's text columns, each a tag: what a statement
// prepared under the probe's pgx name returns instead of the truth.
var tagColumns = strings.TrimSuffix(strings.Repeat("'{tag}'::text, ", probeTextColumns), ", ")

// pgxStatementName is the name pgx's statement cache gives sql.
func pgxStatementName(sql string) string {
	d := sha256.Sum256([]byte(sql))
	return "stmtcache_" + hex.EncodeToString(d[0:24])
}

// render fills in h's SQL for tenant, whose number is n.
func (h hostile) render(tenant string, n int, otherDB string) string {
	return strings.NewReplacer(
		"{tag}", tag(tenant), "{tenant}", tenant, "{n}", itoa(n), "{otherdb}", otherDB,
		"{login}", loginRole, "{stmt}", pgxStatementName(probeSQL),
	).Replace(h.sql)
}
