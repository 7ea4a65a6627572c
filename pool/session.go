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
	// to last, such as {"tenant_" + id, "public"}. With ScopeTransaction it
	// needs the pgx.ConnConfig's DefaultQueryExecMode to be
	// QueryExecModeExec or QueryExecModeSimpleProtocol (tenantdb.New
	// checks), since the cached modes parse a statement before its
	// transaction begins. Each name is quoted, so a tenant ID cannot add
	// schemas or SQL of its own; a name longer than 63 bytes, which
	// PostgreSQL would silently truncate, fails the call. It is called with
	// no lock held; an empty result, and every acquire without a tenant,
	// mean the role's default search_path. A panic in it fails that request
	// with an error. Default nil: search_path is left alone.
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
	// Exec, Query, QueryRow, SendBatch, Begin and BeginTx, on a tenantdb.Pool
	// and on an acquired Conn, add no round trip; CopyFrom runs in a
	// transaction of its own (two more round trips). A batch sent with
	// SendBatch gains a first query, the setting, whose result tenantdb
	// reads itself.
	ScopeTransaction
)
