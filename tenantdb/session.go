package tenantdb

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// Session scopes each shared connection to the tenant that holds it (see
// pool.Session for its fields). The zero value sets nothing.
//
// Whatever Session says, a connection passes from one tenant to another (or
// to work done on no tenant's behalf) only in a pristine session: see
// Pool for the reset that runs when a connection changes tenant.
//
// With ScopeSession (the default) the values are set, in a round trip of
// their own at acquire, when the connection does not carry them already:
// the reset at release gives a session its holder's values again, so the
// same tenant's next call needs none. They are the tenant's values
// when the context carries a tenant, and back to the
// defaults (an empty TenantSetting, the role's default search_path) when it
// carries none, as for calls made through Pool.Pgxpool, Pool.AcquireAllIdle
// and a Ping without a tenant. ScopeSession needs a direct connection or a
// proxy in session pooling mode: behind a transaction-pooling proxy
// (PgBouncer pool_mode=transaction and most managed poolers) the setting and
// the statement can run on different server connections, so a statement can
// run under another tenant's setting. Use ScopeTransaction there.
//
// A connection whose setup fails on the server is destroyed, never handed
// out; a setup that fails before touching the connection (a SearchPath
// panic, a schema name PostgreSQL would truncate) fails the call and keeps
// the connection. A connection taken out of the pool with Conn.Hijack keeps
// the state it had.
type Session = pool.Session

// Scope is where Session's values are set: ScopeSession or ScopeTransaction.
type Scope = pool.Scope

const (
	// ScopeSession sets the tenant's values on the connection's session at
	// acquire. See pool.ScopeSession.
	ScopeSession = pool.ScopeSession

	// ScopeTransaction sets the tenant's values inside every statement's
	// transaction, as a transaction-pooling proxy requires. See
	// pool.ScopeTransaction.
	ScopeTransaction = pool.ScopeTransaction
)

// sessionEnabled reports whether s sets anything.
func sessionEnabled(s *Session) bool {
	return s.TenantSetting != "" || s.SearchPath != nil || s.Role != nil
}

// maxIdentifierLen is the longest name PostgreSQL keeps (NAMEDATALEN - 1);
// it truncates longer ones silently.
const maxIdentifierLen = 63

// validateSession rejects what PostgreSQL would refuse or misread on every call,
// for connections that run statements in mode.
func validateSession(s Session, mode pgx.QueryExecMode) error {
	if s.Scope != ScopeSession && s.Scope != ScopeTransaction {
		return fmt.Errorf("%w: Session.Scope %d is neither ScopeSession nor ScopeTransaction", pool.ErrInvalidConfig, s.Scope)
	}
	if s.Scope == ScopeTransaction && mode != pgx.QueryExecModeExec && mode != pgx.QueryExecModeSimpleProtocol {
		// The other modes parse or describe a statement in a round trip
		// of its own, before the transaction that pins the role and the
		// search_path, and (the cached ones) as a named prepared
		// statement, which a transaction pooler may not have on the
		// server connection the next transaction gets.
		return fmt.Errorf("%w: Session.Scope ScopeTransaction needs ConnConfig.DefaultQueryExecMode "+
			"pgx.QueryExecModeExec or pgx.QueryExecModeSimpleProtocol (got %v): the other modes parse statements "+
			"outside the transaction that sets the tenant's values, and the cached ones keep prepared statements "+
			"that a transaction pooler does not carry from one server connection to another", pool.ErrInvalidConfig, mode)
	}
	if name := s.TenantSetting; name != "" && !validCustomSetting(name) {
		return fmt.Errorf("%w: Session.TenantSetting %q must be a custom setting name like \"app.tenant_id\": "+
			"identifiers (a letter or _, then letters, digits, _ or $) joined by dots, at most %d bytes",
			pool.ErrInvalidConfig, name, maxIdentifierLen)
	}
	return nil
}

// validCustomSetting reports whether PostgreSQL accepts name as a custom
// setting, as its valid_custom_variable_name does, restricted to ASCII.
func validCustomSetting(name string) bool {
	if len(name) > maxIdentifierLen {
		return false
	}
	dots, start := 0, true
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '.':
			if start {
				return false // an empty part
			}
			dots, start = dots+1, true
		case c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
			start = false
		case !start && (c == '$' || '0' <= c && c <= '9'):
		default:
			return false
		}
	}
	return dots > 0 && !start
}

// sessionSetup holds the Session and builds the statements that apply it.
type sessionSetup struct {
	cfg    Session
	logger *slog.Logger // Config.Logger or slog.Default

	// acquiring counts the Pool's calls waiting for a connection of the
	// shared pgxpool, and idle reports whether it has an idle one (nil with
	// Config.Database): while calls wait and none is idle, a release leaves
	// the reset to the next holder (see release). A call that holds its
	// slot waits for a connection only while connections are out of the
	// pool without a slot (the gate's capacity is MaxConns): in resets at
	// release, which resets counts, or in a pgxpool.Config's AfterRelease
	// (inHook); acquire counts the calls only then, so that an acquire
	// that cannot wait pays no shared counter (two atomic adds). Connections
	// taken through Pool.Pgxpool are not seen.
	acquiring atomic.Int32
	resets    atomic.Int32
	idle      func() bool

	// waiting, with Config.Database and Affinity, reports whether a tenant
	// has calls waiting at the gate: a release of its connection leaves
	// the reset to the next holder then, so that the connection is idle in
	// its database for the call that affinity admits next (see release).
	waiting func(tenant string) bool

	// streak is the tenant of the last acquires, whose releases leave the
	// reset to the next holder while it is the only tenant at work.
	streak tenantStreak

	// inHook is set when the pgxpool.Config has an AfterRelease hook of
	// its own, which pgxpool runs at every release: the reset at release
	// runs in it then, before the user's (see install and release).
	inHook bool
}

// values returns the SQL expressions that set tenant's values, local to the
// transaction or for the session, as literals (nil when Session sets
// nothing). With pin, transaction-local values also pin the role and the
// search_path: the tenant's, or the login role and defaultPath (see
// localStatement). It touches no connection, so its errors leave the
// connection as it was.
func (s *sessionSetup) values(tenant string, local, pin bool, defaultPath string) ([]string, error) {
	var exprs []string
	if s.cfg.Role != nil || local {
		role, err := s.role(tenant)
		if err != nil {
			return nil, err
		}
		if role != "none" || !local || pin { // without pin, the login role ("none") is the session's already
			exprs = append(exprs, setConfig("role", quoteLiteral(role), local))
		}
	}
	if s.cfg.TenantSetting != "" {
		exprs = append(exprs, setConfig(s.cfg.TenantSetting, quoteLiteral(tenant), local))
	}
	if s.cfg.SearchPath != nil || local {
		var path string
		if s.cfg.SearchPath != nil {
			var err error
			if path, err = s.path(tenant); err != nil {
				return nil, err
			}
		}
		switch {
		case local && path == "" && !pin:
			// The caller knows the session holds its default already.
		case local && path == "":
			exprs = append(exprs, setConfig("search_path", quoteLiteral(defaultPath), true))
		case local:
			exprs = append(exprs, setConfig("search_path", quoteLiteral(path+", pg_temp"), true))
		case path != "":
			exprs = append(exprs, setConfig("search_path", quoteLiteral(path), false))
		default:
			// The role's default: a scalar subquery, evaluated only here,
			// never for a tenant with a path.
			exprs = append(exprs, setConfig("search_path",
				"(select reset_val from pg_catalog.pg_settings where name operator(pg_catalog.=) 'search_path')", false))
		}
	}
	return exprs, nil
}

// quoteSettingName quotes each part of a custom setting's name (see
// validCustomSetting) as an identifier, for SET, where a part that is a
// reserved word would otherwise not parse. Setting names are matched without
// regard to case, so quoting changes nothing else.
func quoteSettingName(name string) string {
	return `"` + strings.ReplaceAll(name, ".", `"."`) + `"`
}

// setConfig calls set_config by its schema, so that a function of that name
// in a schema that a session put on its search_path cannot stand in for it.
func setConfig(name, value string, local bool) string {
	return fmt.Sprintf("pg_catalog.set_config('%s', %s, %t)", name, value, local)
}

// quoteLiteral quotes s as an escape string literal, whose meaning does not
// depend on standard_conforming_strings. Tenant IDs and schema names carry
// no NUL byte (pool refuses control characters; path checks schema names).
func quoteLiteral(s string) string {
	return "E'" + literalEscaper.Replace(s) + "'"
}

// literalEscaper escapes backslashes and quotes for quoteLiteral; built
// once, since every acquire with a Session quotes the tenant ID.
var literalEscaper = strings.NewReplacer(`\`, `\\`, `'`, `''`)

// path returns tenant's search_path as a list of quoted schema names, or ""
// (the role's default) for no tenant or no schemas.
func (s *sessionSetup) path(tenant string) (string, error) {
	if tenant == "" {
		return "", nil
	}
	schemas, err := s.searchPath(tenant)
	if err != nil || len(schemas) == 0 {
		return "", err
	}
	quoted := make([]string, len(schemas))
	for i, name := range schemas {
		if err := checkName("Session.SearchPath", "schema", tenant, name); err != nil {
			return "", err
		}
		if name == "pg_temp" {
			return "", fmt.Errorf("tenantdb: Session.SearchPath for tenant %q returned pg_temp, which PostgreSQL reads as "+
				"the session's temporary schema, where any statement of the session can put a table", tenant)
		}
		quoted[i] = pgx.Identifier{name}.Sanitize()
	}
	return strings.Join(quoted, ", "), nil
}

// checkName refuses a name (of a schema or role that fn returned for
// tenant) that PostgreSQL would refuse or silently truncate.
func checkName(fn, what, tenant, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("tenantdb: %s for tenant %q returned an empty %s name", fn, tenant, what)
	case len(name) > maxIdentifierLen:
		return fmt.Errorf("tenantdb: %s for tenant %q returned %s %q of %d bytes; "+
			"PostgreSQL truncates names to %d bytes, so two tenants could share it", fn, tenant, what, name, len(name), maxIdentifierLen)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("tenantdb: %s for tenant %q returned a %s name with a NUL byte", fn, tenant, what)
	}
	return nil
}

// role returns the role tenant's statements run as: Role's, or "none" (as
// SET ROLE NONE: the login role) without a tenant or a Role.
func (s *sessionSetup) role(tenant string) (name string, err error) {
	if tenant == "" || s.cfg.Role == nil {
		return "none", nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("tenantdb: Session.Role panicked for tenant %q: %v", tenant, r)
		}
	}()
	name = s.cfg.Role(tenant)
	if err := checkName("Session.Role", "role", tenant, name); err != nil {
		return "", err
	}
	if name == "none" {
		return "", fmt.Errorf("tenantdb: Session.Role for tenant %q returned \"none\", which PostgreSQL reads as the login role", tenant)
	}
	return name, nil
}

// searchPath calls the user's SearchPath, turning a panic into an error: a
// panic inside pgxpool's acquire would leak the connection it holds.
func (s *sessionSetup) searchPath(tenant string) (schemas []string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("tenantdb: Session.SearchPath panicked for tenant %q: %v", tenant, r)
		}
	}()
	return s.cfg.SearchPath(tenant), nil
}

// transactional reports whether statements must set the tenant's values
// themselves (ScopeTransaction with something to set).
func (s *sessionSetup) transactional() bool {
	return s != nil && s.cfg.Scope == ScopeTransaction && sessionEnabled(&s.cfg)
}

// sessionValues is the statement that sets tenant's values for the
// session, with timeout (when positive) as its statement_timeout: "" without
// ScopeSession or with nothing to set.
func (s *sessionSetup) sessionValues(tenant string, timeout time.Duration) (string, error) {
	if s.cfg.Scope != ScopeSession || timeout <= 0 && !sessionEnabled(&s.cfg) {
		return "", nil
	}
	var sql string
	if s.cfg.Role == nil && s.cfg.SearchPath == nil && s.cfg.TenantSetting != "" {
		// A SET is a utility statement, which the server neither plans
		// nor executes as a query: a third of a SELECT's cost.
		sql = "set " + quoteSettingName(s.cfg.TenantSetting) + " to " + quoteLiteral(tenant)
	} else {
		exprs, err := s.values(tenant, false, false, "")
		if err != nil {
			return "", err
		}
		if len(exprs) > 0 {
			sql = "select " + strings.Join(exprs, ", ")
		}
	}
	if timeout > 0 {
		if sql != "" {
			sql += "; "
		}
		sql += "set statement_timeout to " + timeoutMillis(timeout)
	}
	return sql, nil
}

// localStatement returns the statement that sets tenant's values for the
// current transaction on conn, pinning the role and the search_path, with
// timeout (when positive) as its statement_timeout, or "" when there is
// nothing to set. The pins hold even where the server session
// is not the one tenantdb reset: behind a transaction pooler, or after the
// tenant's own session-level SET ROLE or search_path earlier in its hold.
func (s *sessionSetup) localStatement(tenant string, conn *pgconn.PgConn, timeout time.Duration) (string, error) {
	var exprs []string
	if s.transactional() {
		path, ok := conn.CustomData()[defaultPathKey].(string)
		if !ok {
			return "", fmt.Errorf("tenantdb: the connection's default search_path is unknown: it was not opened by the Pool's pgxpool")
		}
		var err error
		if exprs, err = s.values(tenant, true, true, path); err != nil {
			return "", err
		}
	}
	if timeout > 0 {
		exprs = append(exprs, setConfig("statement_timeout", "'"+timeoutMillis(timeout)+"'", true))
	}
	if len(exprs) == 0 {
		return "", nil
	}
	return "select " + strings.Join(exprs, ", "), nil
}

// timeoutMillis is d in whole milliseconds, rounded up (statement_timeout's
// unit; 0 would mean no timeout).
func timeoutMillis(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10)
}

// install chains the hooks before the pgxCfg's own: connect before its
// AfterConnect, prepare before its PrepareConn (or its deprecated
// BeforeAcquire, which pgxpool ignores once PrepareConn is set), so that
// the user's hook sees the tenant's state, and, when it has an
// AfterRelease, afterRelease before it; without one, tenantdb resets
// sessions in its own releases (see release); BeforeClose empties the
// connection's slot of stateCache before the user's. A panic in the user's
// PrepareConn fails the acquire with an error and destroys the connection,
// instead of leaking it inside pgxpool.
func (s *sessionSetup) install(pgxCfg *pgxpool.Config, server *serverChecks) {
	if after := pgxCfg.AfterRelease; after != nil {
		s.inHook = true
		pgxCfg.AfterRelease = func(c *pgx.Conn) bool { return s.afterRelease(c) && after(c) }
	}
	if before := pgxCfg.BeforeClose; before == nil {
		pgxCfg.BeforeClose = func(c *pgx.Conn) { forgetState(c.PgConn()) }
	} else {
		pgxCfg.BeforeClose = func(c *pgx.Conn) {
			forgetState(c.PgConn())
			before(c)
		}
	}
	if after := pgxCfg.AfterConnect; after == nil {
		pgxCfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error { return s.connect(ctx, c, server) }
	} else {
		pgxCfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			if err := s.connect(ctx, c, server); err != nil {
				return err
			}
			return after(ctx, c)
		}
	}
	own := pgxCfg.PrepareConn
	if own == nil && pgxCfg.BeforeAcquire != nil {
		before := pgxCfg.BeforeAcquire
		own = func(ctx context.Context, c *pgx.Conn) (bool, error) { return before(ctx, c), nil }
	}
	if own == nil {
		pgxCfg.PrepareConn = s.prepare
		return
	}
	pgxCfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if ok, err := s.prepare(ctx, c); !ok || err != nil {
			return ok, err
		}
		return callUserHook(ctx, c, own)
	}
}

// callUserHook calls the user's PrepareConn, turning a panic into an error
// that destroys the connection.
func callUserHook(ctx context.Context, c *pgx.Conn, hook func(context.Context, *pgx.Conn) (bool, error)) (ok bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			ok, err = false, fmt.Errorf("tenantdb: the pgxpool.Config's PrepareConn or BeforeAcquire panicked: %v", r)
		}
	}()
	return hook(ctx, c)
}

// withoutTenant hides the tenant ctx carries, for work done on no tenant's
// behalf: the session hook then restores the defaults.
func withoutTenant(ctx context.Context) context.Context {
	return pool.WithoutTenant(ctx)
}
