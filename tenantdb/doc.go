// Package tenantdb gives every tenant of a multi-tenant service its own
// bulkhead over one shared PostgreSQL connection pool.
//
// A [Pool] wraps a [pgxpool.Pool] and has its method set (Exec, Query,
// QueryRow, Begin, SendBatch, CopyFrom, Acquire, ...), so code written against
// pgxpool, or against an interface of those methods such as sqlc's DBTX, moves
// over by putting the tenant in the context:
//
//	ctx = tenantdb.WithTenant(ctx, "acme")
//	rows, err := p.Query(ctx, "select ...")
//
// Each call first takes one of the tenant's own slots (its plan's MaxConns),
// then a connection from the shared pool, so a tenant's slow queries can hold
// at most its share of the connections and a tenant waiting for its own cap
// holds none of them. Over its cap a request is rejected at once with an
// [*OverLimitError] (a handler turns it into HTTP 429 with [WriteOverLimit]), or
// waits in a small bounded queue, as its plan says. The shared pool's MaxConns
// stays the global limit; when it is exhausted, tenants are served in weighted
// round-robin order and plans may reserve connections. The admission itself is
// package [github.com/tenantdb/tenantdb/pool].
//
// A slot is held exactly as long as the connection is: until Exec returns,
// until Rows are closed, read to the end or fail to scan, until a Row is
// scanned, until a Tx commits or rolls back, until BatchResults are closed,
// until a Conn is released. Every path releases it, including errors,
// cancelled contexts, broken connections and panics.
//
// A shared connection passes from one tenant to another only in a pristine
// session: what the previous tenant left in it (settings, roles, temporary
// tables, cursors, prepared statements, LISTEN, advisory locks) is undone
// first, as DISCARD ALL does. With [Config.Session], each statement also runs
// with the tenant's values (a setting that row-level security policies
// read, a search_path): set on the session at acquire ([ScopeSession]), or
// inside each statement's transaction ([ScopeTransaction]), which holds
// behind a transaction-pooling proxy. Work done on no tenant's behalf uses
// [Pool.Pgxpool], a Ping without a tenant (a health check) or
// [Pool.AcquireAllIdle]. [Pool.Sizing] is the sizing check: the caps of
// the tenants busy at once against MaxConns.
//
// With [Config.Adaptive], a tenant's effective limit moves below its cap while
// its own queries show that more of them at once only queue inside the
// database (CPU-bound scans on a database with few cores), and back up while
// they do not; waiting-type work keeps its cap.
package tenantdb
