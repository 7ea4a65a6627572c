package tenantdb

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
)

// ErrNoDatabase is matched by the error of a call whose tenant has no usable
// database: Config.Database returned an error, panicked, or returned a name
// that is empty, longer than 63 bytes or holds a NUL byte.
var ErrNoDatabase = errors.New("tenantdb: no database for the tenant")

// ErrTooManyDatabases is returned when a Pool with Config.Database keeps
// Config.MaxDatabases databases and each has a call in flight.
var ErrTooManyDatabases = errors.New("tenantdb: too many databases in use")

// defaultMaxDatabases is Config.MaxDatabases's default.
const defaultMaxDatabases = 10_000

// failHold is how long a database whose connect failed fails its tenants'
// calls with that error without connecting again, so that a flood of calls
// to a database that does not exist closes no other database's idle
// connections to make room for it.
const failHold = time.Second

// databases are the pgxpools of a Pool with Config.Database, one per
// database, created on first use from the template config and dropped when
// unused, all opening their connections within one budget.
type databases struct {
	name      func(tenantID string) (string, error) // Config.Database; nil with NewServers without it
	server    string                                // the server's name with NewServers, else ""
	down      atomic.Pointer[downState]             // with NewServers: set while the server is known down
	template  *pgxpool.Config
	max       int
	idleTTL   time.Duration
	budget    *budget
	admin     *database   // the template's own database: Pool.Pgxpool, never dropped
	replicas  *replicaSet // with NewServers: the server's replicas (WithReplicas), or nil
	replicaOf *replicaSet // a replica's: the set it is one of; else nil
	totals    counters    // of every database since New

	mu     sync.Mutex
	byName map[string]*database // guarded by mu
	lru    list.List            // guarded by mu; of *database, most recently used first
	closed bool                 // guarded by mu
}

// database is one database's pgxpool and its counters.
type database struct {
	name string
	d    *databases
	pg   *pgxpool.Pool
	elem *list.Element // guarded by databases.mu
	used time.Time     // guarded by databases.mu; the last call's start

	busy atomic.Int32 // calls holding or acquiring one of its connections
	open atomic.Int32 // connections open or opening to it
	counters
	failed atomic.Pointer[connectFailure]
}

// counters count the opens and closes of connections and the time of the
// opens, from asking the budget for room to the connection being ready.
type counters struct {
	opens, closes, connecting atomic.Int64
}

// connectFailure is a database's last failed connect.
type connectFailure struct {
	err   error
	until time.Time
}

// evictingKey marks the context of an eviction's AcquireAllIdle, for
// which the session setup does nothing.
type evictingKey struct{}

func newDatabases(template *pgxpool.Config, cfg Config, idleTTL time.Duration) *databases {
	d := &databases{
		name: cfg.Database, template: template, max: cfg.MaxDatabases, idleTTL: idleTTL,
		byName: make(map[string]*database),
	}
	if d.max == 0 {
		d.max = defaultMaxDatabases
	}
	d.budget = newBudget(int(template.MaxConns), d)
	return d
}

// wrapTemplate makes pgxCfg, the config of db's pgxpool (a tenant
// database's, or the template's own for Pool.Pgxpool), count its
// connections in the budget and skip the session setup of an eviction's
// acquire.
func (d *databases) wrapTemplate(pgxCfg *pgxpool.Config, db *database) {
	pgxCfg.MinConns, pgxCfg.MinIdleConns = 0, 0
	beforeConnect := pgxCfg.BeforeConnect
	pgxCfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if beforeConnect != nil {
			if err := beforeConnect(ctx, cc); err != nil {
				return err
			}
		}
		cc.DialFunc = d.budget.connDial(db, cc.DialFunc) // after the user's, which may set its own
		return nil
	}
	if prepare := pgxCfg.PrepareConn; prepare != nil {
		pgxCfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
			if ctx.Value(evictingKey{}) != nil {
				return true, nil
			}
			return prepare(ctx, c)
		}
	}
	afterConnect := pgxCfg.AfterConnect
	pgxCfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if cc := counted(c.PgConn().Conn()); cc != nil {
			cc.d.open()
			cc.ready.Store(true)
			took := int64(time.Since(cc.start))
			db.connecting.Add(took)
			d.totals.connecting.Add(took)
		}
		db.opens.Add(1)
		d.totals.opens.Add(1)
		d.up()
		if afterConnect != nil {
			return afterConnect(ctx, c)
		}
		return nil
	}
}

// tenantDatabase returns the name of tenant's database, checked.
func (d *databases) tenantDatabase(tenant string) (name string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: Config.Database panicked for tenant %q: %v", ErrNoDatabase, tenant, r)
		}
	}()
	name, err = d.name(tenant)
	if err != nil {
		return "", fmt.Errorf("%w: Config.Database for tenant %q: %w", ErrNoDatabase, tenant, err)
	}
	return name, checkDatabaseName("Config.Database", tenant, name)
}

// checkDatabaseName says why name, from source, cannot be tenant's
// database, or returns nil.
func checkDatabaseName(source, tenant, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s returned an empty name for tenant %q", ErrNoDatabase, source, tenant)
	case len(name) > maxIdentifierLen:
		return fmt.Errorf("%w: %s returned %q of %d bytes for tenant %q; "+
			"PostgreSQL truncates names to %d bytes, so two tenants could share it",
			ErrNoDatabase, source, name, len(name), tenant, maxIdentifierLen)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%w: %s returned a name with a NUL byte for tenant %q", ErrNoDatabase, source, tenant)
	}
	return nil
}

// use returns the use of the database of the tenant in ctx, an admitted
// one (so that Config.Database sees only valid tenant IDs), or the error of
// its last failed connect while that is recent.
func (d *databases) use(ctx context.Context) (*dbUse, error) {
	tenant, _ := TenantFrom(ctx)
	name, err := d.tenantDatabase(tenant)
	if err != nil {
		return nil, err
	}
	return d.useName(name)
}

// useName returns the use of the database named name, or of the
// template's own with "", or the error of its last failed connect while
// that is recent.
func (d *databases) useName(name string) (*dbUse, error) {
	if err := d.checkDown(); err != nil {
		return nil, err
	}
	var u *dbUse
	if name == "" {
		d.admin.busy.Add(1)
		u = &dbUse{database: d.admin}
	} else {
		var err error
		if u, err = d.acquire(name); err != nil {
			return nil, err
		}
	}
	if f := u.failed.Load(); f != nil && time.Now().Before(f.until) {
		u.done()
		return nil, f.err
	}
	return u, nil
}

// acquire returns the use of the database named name, created if need be,
// marked busy until the use is done.
func (d *databases) acquire(name string) (*dbUse, error) {
	for {
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			return nil, ErrClosed
		}
		if db := d.byName[name]; db != nil {
			db.busy.Add(1)
			db.used = time.Now()
			d.lru.MoveToFront(db.elem)
			d.mu.Unlock()
			return &dbUse{database: db}, nil
		}
		var drop *database
		if len(d.byName) >= d.max {
			if drop = d.unusedLocked(time.Time{}); drop == nil {
				d.mu.Unlock()
				return nil, fmt.Errorf("%w: %d databases, each with a call in flight (Config.MaxDatabases)",
					ErrTooManyDatabases, len(d.byName))
			}
			d.removeLocked(drop)
		}
		d.mu.Unlock()
		if drop != nil {
			drop.pg.Close()
		}
		db, err := d.create(name)
		if err != nil {
			return nil, err
		}
		d.mu.Lock()
		if d.closed || d.byName[name] != nil || len(d.byName) >= d.max {
			d.mu.Unlock()
			db.pg.Close() // never used: try again
			continue
		}
		db.busy.Add(1)
		db.used = time.Now()
		db.elem = d.lru.PushFront(db)
		d.byName[name] = db
		d.mu.Unlock()
		return &dbUse{database: db}, nil
	}
}

// create makes the pgxpool of database name from the template.
func (d *databases) create(name string) (*database, error) {
	db := &database{name: name, d: d}
	cfg := d.template.Copy()
	cfg.ConnConfig.Database = name
	d.wrapTemplate(cfg, db)
	pg, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("tenantdb: database %q: %w", name, err)
	}
	db.pg = pg
	return db, nil
}

// dbUse is one call's use of a database, shared by the copies of a Conn
// so that only the first release ends it.
type dbUse struct {
	*database
	ended atomic.Bool
}

// done ends the use; only the first call has an effect, and nil does
// nothing.
func (u *dbUse) done() {
	if u == nil || u.ended.Swap(true) {
		return
	}
	u.busy.Add(-1)
	u.d.budget.idled()
}

// connectError names db in err and, when err is a connect the server
// failed, keeps it for failHold so that the tenant's next calls fail
// without connecting.
func (db *database) connectError(ctx context.Context, tenant string, err error) error {
	if db.d.server != "" && serverDown(ctx, err) {
		db.d.markDown(connectCause{err}) // the server's other tenants see it: no tenant, no database in its text
	}
	var ce *pgconn.ConnectError
	where := fmt.Sprintf("database %q", db.name)
	if db.d.server != "" {
		where = fmt.Sprintf("database %q on server %q", db.name, db.d.server)
	}
	if errors.As(err, &ce) {
		if serverFailed(err) {
			// The database's other tenants see it: it names no tenant.
			db.failed.Store(&connectFailure{err: fmt.Errorf("tenantdb: connect to %s: %w", where, err), until: time.Now().Add(failHold)})
		}
		return fmt.Errorf("tenantdb: connect to %s of tenant %q: %w", where, tenant, err)
	}
	return fmt.Errorf("tenantdb: %s of tenant %q: %w", where, tenant, err)
}

// serverFailed reports whether a failed connect is the server's doing (a
// refused connection or login, a database that does not exist) rather than
// a wait that ended: for room in the budget, or of a context (the call's,
// or connect_timeout's). Only the server's say something about the next
// call: room can be made from idle connections at any moment.
func serverFailed(err error) bool {
	return !errors.Is(err, errNoRoom) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// closeIdle closes one idle connection of the least recently used database
// that has one, other than except if another has one, and reports whether
// it did. The connection's room in the budget is back when it returns,
// unless its server process takes longer than closeWait to end.
func (d *databases) closeIdle(except *database) bool {
	var candidates [4]*database
	n := 0
	d.mu.Lock()
	for e := d.lru.Back(); e != nil && n < len(candidates); e = e.Prev() {
		if db := e.Value.(*database); db != except && db.open.Load() > db.busy.Load() {
			candidates[n] = db
			n++
		}
	}
	d.mu.Unlock()
	for _, db := range candidates[:n] {
		if db.closeIdle() {
			return true
		}
	}
	if d.admin != except && d.admin.closeIdle() {
		return true
	}
	return except.closeIdle()
}

// closeIdle closes one of db's idle connections, if it has one.
func (db *database) closeIdle() bool {
	idle := db.pg.AcquireAllIdle(context.WithValue(context.Background(), evictingKey{}, true))
	if len(idle) == 0 {
		return false
	}
	last := idle[len(idle)-1]
	for _, c := range idle[:len(idle)-1] {
		c.Release()
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	_ = last.Conn().Close(ctx) // the countedConn waits for the server process to end
	last.Release()             // pgxpool destroys the closed connection
	return true
}

// unusedLocked returns the least recently used database with no call in
// flight, last used before cutoff (any time if cutoff is zero), or nil.
func (d *databases) unusedLocked(cutoff time.Time) *database {
	for e := d.lru.Back(); e != nil; e = e.Prev() {
		db := e.Value.(*database)
		if !cutoff.IsZero() && !db.used.Before(cutoff) {
			return nil // the rest were used later
		}
		if db.busy.Load() == 0 {
			return db
		}
	}
	return nil
}

func (d *databases) removeLocked(db *database) {
	d.lru.Remove(db.elem)
	delete(d.byName, db.name)
}

// evictIdle drops the databases unused for idleTTL, closing their pgxpools
// and so their idle connections.
func (d *databases) evictIdle() {
	cutoff := time.Now().Add(-d.idleTTL)
	for {
		d.mu.Lock()
		db := d.unusedLocked(cutoff)
		if db != nil {
			d.removeLocked(db)
		}
		d.mu.Unlock()
		if db == nil {
			return
		}
		db.pg.Close()
	}
}

// each calls f for every database, outside the lock.
func (d *databases) each(f func(*database)) {
	d.mu.Lock()
	all := make([]*database, 0, len(d.byName))
	for e := d.lru.Front(); e != nil; e = e.Next() {
		all = append(all, e.Value.(*database))
	}
	d.mu.Unlock()
	for _, db := range all {
		f(db)
	}
}

// close closes every database's pgxpool; later acquires fail with
// ErrClosed.
func (d *databases) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.each(func(db *database) { db.pg.Close() })
	d.admin.pg.Close()
	if d.replicas != nil {
		d.replicas.close()
	}
}

// validateDatabases rejects what cannot work with cfg.Database.
func validateDatabases(cfg Config, pgxCfg *pgxpool.Config) error {
	if cfg.MaxDatabases < 0 {
		return fmt.Errorf("tenantdb: %w: MaxDatabases must not be negative, got %d", pool.ErrInvalidConfig, cfg.MaxDatabases)
	}
	if cfg.Database == nil {
		return nil
	}
	if pgxCfg.MinConns > 0 || pgxCfg.MinIdleConns > 0 {
		return fmt.Errorf("tenantdb: %w: with Config.Database the pgxpool.Config is the template of every database's "+
			"connections: MinConns %d and MinIdleConns %d would keep connections open in each; leave them 0",
			pool.ErrInvalidConfig, pgxCfg.MinConns, pgxCfg.MinIdleConns)
	}
	return nil
}
