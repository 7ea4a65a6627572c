package pool

// Session is the per-tenant state tenantdb sets on each shared PostgreSQL
// connection before a tenant's call uses it, for row-level security policies
// and schema-per-tenant layouts (see tenantdb.Session for when and how). A
// Gate ignores it. The zero value sets nothing.
type Session struct {
	// TenantSetting names a custom setting (two or more identifiers joined
	// by dots, such as "app.tenant_id"; tenantdb.New rejects a name
	// PostgreSQL would refuse) that is set to the tenant ID. RLS policies
	// read it with current_setting('app.tenant_id', true); without a tenant
	// it is ''. Default "": no setting.
	TenantSetting string

	// SearchPath returns the schemas a tenant's statements search, first
	// to last, such as {"tenant_" + id, "public"}. Each name is quoted, so
	// a tenant ID cannot add schemas or SQL of its own; a name PostgreSQL
	// would truncate (longer than 63 bytes) or read as the temporary schema
	// (pg_temp) fails the call. It is called with no lock held; an empty
	// result, and every acquire without a tenant, mean the role's default
	// search_path. A panic in it fails that request with an error. Default
	// nil: search_path is left alone (under ScopeTransaction, pinned to the
	// login role's default).
	SearchPath func(tenantID string) []string

	// Role returns the database role a tenant's statements run as (as SET
	// ROLE does), such as "tenant_" + id, for policies written on
	// current_user and grants per tenant. The login role must be a member
	// of each (GRANT tenant_acme TO app). A name PostgreSQL would refuse or
	// truncate (empty, "none", longer than 63 bytes, a NUL byte) fails the
	// call, as does a panic in it; it is called with no lock held. Work
	// without a tenant runs as the login role. Default nil: the login role.
	Role func(tenantID string) string

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
	// Each of those transactions also pins the role (Role's, or the login
	// role) and the search_path (SearchPath's, or the login role's default,
	// with pg_temp last), so that what a session-level statement left on a
	// server connection (SET ROLE, SET search_path, a temporary table)
	// cannot change what the next tenant's statements read there. On a
	// direct connection the transaction right after a change of tenant is
	// not pinned to the login role's defaults: the reset in front of it has
	// just restored them (see tenantdb.Pool). It needs
	// the pgx.ConnConfig's DefaultQueryExecMode to be QueryExecModeExec or
	// QueryExecModeSimpleProtocol (tenantdb.New checks).
	// Exec, Query, QueryRow, SendBatch, Begin and BeginTx, on a tenantdb.Pool
	// and on an acquired Conn, add no round trip; CopyFrom runs in a
	// transaction of its own (two more round trips). A batch sent with
	// SendBatch gains a first query, the setting, whose result tenantdb
	// reads itself.
	ScopeTransaction
)
