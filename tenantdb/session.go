package tenantdb

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// Session scopes each shared connection to the tenant that holds it, for
// row-level security policies and schema-per-tenant layouts. The zero value
// sets nothing and costs nothing.
//
// The state is set on every acquire from the shared pool, in one round trip,
// before the connection is handed out: to the tenant's values when the
// context carries a tenant, and back to the defaults (an empty TenantSetting,
// the role's default search_path) when it carries none, as for calls made
// through Pool.Pgxpool, Pool.AcquireAllIdle and a Ping without a tenant. So
// no connection reaches a caller with another tenant's state, whatever the
// previous holder did with it (a session-level SET, a panic, a killed
// backend). A connection whose setup fails is destroyed, never handed out;
// when it failed because the connection was broken, pgxpool retries on
// another one.
//
// What it cannot cover: a connection taken out of the pool with Conn.Hijack
// keeps the state it had; code that changes these settings itself on a
// connection it holds sees its own values until it releases it.
type Session struct {
	// TenantSetting names a custom setting (it must contain a dot, such as
	// "app.tenant_id") that is set to the tenant ID with
	// set_config(TenantSetting, tenantID, false). RLS policies read it with
	// current_setting('app.tenant_id', true); without a tenant it is ''.
	// Default "": no setting.
	TenantSetting string

	// SearchPath returns the schemas a tenant's connections search, first
	// to last, such as {"tenant_" + id, "public"}. tenantdb quotes each
	// name, so a tenant ID cannot add schemas or SQL of its own. It is
	// called on every acquire for a tenant, with no lock held; an empty
	// result, and every acquire without a tenant, restore the role's
	// default search_path. A panic in it fails that request with an error.
	// Default nil: search_path is left alone.
	SearchPath func(tenantID string) []string

	// Scope says where the tenant's values live: ScopeSession (the default)
	// sets them on the connection's session at acquire; ScopeTransaction
	// sets them transaction-locally inside every statement's transaction,
	// as a transaction-pooling proxy (PgBouncer pool_mode=transaction)
	// requires.
	Scope Scope
}

// Scope is where Session's values are set. See ScopeSession and
// ScopeTransaction.
type Scope int

const (
	// ScopeSession sets the tenant's values with set_config(..., false) when
	// a connection is acquired, in one round trip. It needs a direct
	// connection or session pooling: behind a transaction-pooling proxy the
	// setting and the statement can run on different server connections.
	ScopeSession Scope = iota

	// ScopeTransaction sets the tenant's values with set_config(..., true)
	// in the transaction each statement runs in (a statement outside an
	// explicit transaction gets an implicit one, in the same round trip), so
	// they hold behind a transaction-pooling proxy and vanish at its end.
	ScopeTransaction
)

func (s Session) enabled() bool { return s.TenantSetting != "" || s.SearchPath != nil }

// validate rejects a setting name PostgreSQL would refuse on every acquire.
func (s Session) validate() error {
	name := s.TenantSetting
	if name == "" {
		return nil
	}
	dot := strings.IndexByte(name, '.')
	ok := dot > 0 && dot < len(name)-1 && len(name) <= 63
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c == '_' || c == '.' || c == '$' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
	}
	if !ok || name[len(name)-1] == '.' || name[0] >= '0' && name[0] <= '9' {
		return fmt.Errorf("%w: Session.TenantSetting %q must be a custom setting name like \"app.tenant_id\" (letters, digits, _ and $, with a dot)",
			pool.ErrInvalidConfig, name)
	}
	return nil
}

// sessionSetup is the statements and hook that set a connection's state.
type sessionSetup struct {
	cfg Session
	sql string // for a tenant, with parameters
	// reset restores the defaults for acquires without a tenant: constant
	// statements, sent in one round trip by the simple protocol (pgx uses it
	// for an Exec without arguments). RESET search_path is much cheaper than
	// reading the default from pg_settings, which scans every setting.
	reset string
}

func newSessionSetup(cfg Session) *sessionSetup {
	var parts []string
	n := 1
	if cfg.TenantSetting != "" {
		parts = append(parts, "set_config($1::text, $2::text, false)")
		n = 3
	}
	if cfg.SearchPath != nil {
		// The default comes from a scalar subquery that PostgreSQL
		// evaluates only when the parameter is null, so a tenant's path
		// costs no pg_settings scan.
		parts = append(parts, fmt.Sprintf("set_config('search_path', coalesce($%d::text, "+
			"(select reset_val from pg_settings where name = 'search_path')), false)", n))
	}
	var reset []string
	if cfg.TenantSetting != "" {
		// validate allowed only letters, digits, _, $ and dots: safe in a literal.
		reset = append(reset, "select set_config('"+cfg.TenantSetting+"', '', false)")
	}
	if cfg.SearchPath != nil {
		reset = append(reset, "reset search_path")
	}
	return &sessionSetup{cfg: cfg, sql: "select " + strings.Join(parts, ", "), reset: strings.Join(reset, "; ")}
}

// args returns the setup's arguments for tenant ("" for none).
func (s *sessionSetup) args(tenant string) ([]any, error) {
	args := make([]any, 0, 3)
	if s.cfg.TenantSetting != "" {
		args = append(args, s.cfg.TenantSetting, tenant)
	}
	if s.cfg.SearchPath != nil {
		path, err := s.path(tenant)
		if err != nil {
			return nil, err
		}
		args = append(args, path)
	}
	return args, nil
}

// path returns tenant's search_path as a list of quoted schema names, or nil
// (the role's default) for no tenant or no schemas.
func (s *sessionSetup) path(tenant string) (any, error) {
	if tenant == "" {
		return nil, nil
	}
	schemas, err := s.searchPath(tenant)
	if err != nil || len(schemas) == 0 {
		return nil, err
	}
	quoted := make([]string, len(schemas))
	for i, name := range schemas {
		if name == "" {
			return nil, fmt.Errorf("tenantdb: Session.SearchPath for tenant %q returned an empty schema name", tenant)
		}
		quoted[i] = pgx.Identifier{name}.Sanitize()
	}
	return strings.Join(quoted, ", "), nil
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

// prepare is the pgxpool PrepareConn hook: it sets the state for the tenant
// in ctx, the acquiring call's context, and governs the round trip with it.
func (s *sessionSetup) prepare(ctx context.Context, conn *pgx.Conn) (bool, error) {
	tenant, _ := TenantFrom(ctx)
	sql, args := s.reset, []any(nil)
	if tenant != "" {
		var err error
		if args, err = s.args(tenant); err != nil {
			return false, err
		}
		sql = s.sql
	}
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		if conn.IsClosed() && ctx.Err() == nil {
			return false, nil // a broken connection: pgxpool tries another
		}
		return false, fmt.Errorf("tenantdb: set the session state for tenant %q: %w", tenant, err)
	}
	return true, nil
}

// install chains the hook before the pgxCfg's own PrepareConn (or its
// deprecated BeforeAcquire, which pgxpool ignores once PrepareConn is set),
// so that the user's hook sees the tenant's state.
func (s *sessionSetup) install(pgxCfg *pgxpool.Config) {
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
		return own(ctx, c)
	}
}

// withoutTenant hides the tenant ctx carries, for work done on no tenant's
// behalf: the session hook then restores the defaults.
func withoutTenant(ctx context.Context) context.Context {
	return pool.WithoutTenant(ctx)
}
