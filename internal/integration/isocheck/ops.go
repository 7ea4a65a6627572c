package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// path is how an operation reaches the server.
type path int

const (
	pathExec path = iota
	pathQuery
	pathQueryRow
	pathBatch
	pathTx
	pathAcquire
	pathSQL
	pathCopy
	numPaths
)

// pathConnTx is a transaction of SQL statements on an acquired Conn: BEGIN,
// SAVEPOINT, the statement, ROLLBACK TO SAVEPOINT after its error, COMMIT.
// It is drawn from the second stream (see genOp), so it is not in numPaths.
const pathConnTx path = 100

var pathNames = [...]string{"Exec", "Query", "QueryRow", "SendBatch", "Begin+savepoint", "Acquire", "tenantsql", "CopyFrom"}

func (p path) String() string {
	if p == pathConnTx {
		return "Acquire+SQL transaction"
	}
	return pathNames[p]
}

// modes are pgx's per-query options a call may put among its arguments
// (nil: none).
var modes = []any{nil, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec,
	pgx.QueryExecModeDescribeExec, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeCacheStatement}

var modeNames = []string{"", "simple", "exec", "describe", "cache-describe", "cache-statement"}

// op is one operation of a tenant: every random choice is made when it is
// generated, so that a sequence of ops replays the same way.
type op struct {
	worker   int
	tenant   int
	hostile  int  // index in catalog, -1 for none
	hPath    path // how the hostile statement (or a write) is sent
	write    bool // insert a row and check where it landed
	pPath    path // how the probe is sent
	mode     int  // index in modes, for the probe
	class    int  // index in classNames
	deadline time.Duration
	cancel   bool // cancel instead of a deadline
	probeDL  time.Duration
	nonce    int32
	hVia     via           // how the first statement reaches its path
	pVia     via           // how the probe reaches its path
	badRole  bool          // a call of the tenant whose Session.Role does not exist (badrole.go)
	cut      time.Duration // for a hostile statement with a cut, or a burst: when its context ends
	burst    bool          // the budget filled with long statements whose deadlines end (burst.go)
	hRO, pRO bool          // the first statement, the probe, marked tenantdb.ReadOnly (replicas.go)
	held     heldKind      // instead of the first statement, a hold that outlives the time limits (held.go)
	heldSet  uint16        // which of heldStmts the hold sends
	heldWait time.Duration // how long past its limit the hold idles or works
}

func (o op) String() string {
	if o.badRole {
		return fmt.Sprintf("w%d %s via %s (its role does not exist)", o.worker, badTenant, o.hPath)
	}
	if o.burst {
		return fmt.Sprintf("w%d t%d burst of pg_sleep(20), deadline %v", o.worker, o.tenant, o.cut)
	}
	s := fmt.Sprintf("w%d t%d", o.worker, o.tenant)
	if o.held != heldNone {
		s += fmt.Sprintf(" %s (statements %#x), then %v more", o.held, o.heldSet, o.heldWait)
	} else if o.hostile >= 0 {
		s += fmt.Sprintf(" hostile %s via %s", catalog[o.hostile].name, o.hPath)
	} else if o.write {
		s += fmt.Sprintf(" write via %s", o.hPath)
	}
	if o.hVia != viaDirect && (o.hostile >= 0 || o.write || o.held != heldNone) {
		s += " in a " + viaNames[o.hVia]
	}
	if o.hRO && (o.hostile >= 0 || o.held != heldNone) {
		s += " ReadOnly"
	}
	s += fmt.Sprintf(", probe via %s", o.pPath)
	if o.pVia != viaDirect {
		s += " in a " + viaNames[o.pVia]
	}
	if o.pRO {
		s += " ReadOnly"
	}
	if o.mode > 0 {
		s += " mode " + modeNames[o.mode]
	}
	if o.class > 0 {
		s += " class " + classNames[o.class]
	}
	if o.deadline > 0 {
		if o.cancel {
			s += fmt.Sprintf(", cancel after %v", o.deadline)
		} else {
			s += fmt.Sprintf(", deadline %v", o.deadline)
		}
	}
	if o.probeDL > 0 {
		s += fmt.Sprintf(", probe deadline %v", o.probeDL)
	}
	return s
}

// genOp draws worker's next op: r draws what the first checker drew, so
// that its seeds keep their sequences, r2 what was added since (the
// adapters, the tenant with a bad role).
func genOp(r, r2 *rand.Rand, c config, worker int) op {
	o := op{worker: worker, tenant: worker % numTenants, hostile: -1, nonce: r.Int32()}
	switch x := r.IntN(10); {
	case x < 5:
		o.hostile = r.IntN(len(catalog))
	case x < 7:
		o.write = true
	}
	o.hPath = path(r.IntN(int(numPaths)))
	if o.hostile >= 0 && o.hPath == pathCopy {
		o.hPath = pathExec
	}
	if o.write && o.hPath == pathCopy && r.IntN(2) == 0 {
		o.hPath = pathQueryRow
	}
	o.pPath = []path{pathQuery, pathQueryRow, pathBatch, pathTx, pathAcquire, pathSQL}[r.IntN(6)]
	if r.IntN(2) == 0 {
		o.mode = r.IntN(len(modes))
		if c.pooler && o.mode >= 4 {
			o.mode = 0 // named statements do not live through a transaction pooler
		}
	}
	if c.classes {
		o.class = r.IntN(len(classNames))
	}
	if r.IntN(4) == 0 {
		o.deadline = time.Duration(1+r.IntN(300)) * time.Millisecond
		o.cancel = r.IntN(2) == 0
	}
	if r.IntN(8) == 0 {
		o.probeDL = time.Duration(1+r.IntN(50)) * time.Millisecond
	}
	drawVia := func() via {
		switch r2.IntN(8) {
		case 0:
			return viaHTTP
		case 1:
			return viaJob
		}
		return viaDirect
	}
	o.hVia, o.pVia = drawVia(), drawVia()
	if c.role && r2.IntN(40) == 0 {
		o.badRole = true
	}
	if o.hPath == pathAcquire && r2.IntN(2) == 0 {
		o.hPath = pathConnTx
	}
	// A cut from its catalog entry's up to 2 s: a short one mostly ends
	// while the call still waits for a connection, a long one while the
	// statement runs, so that its cancel request must go out (issue 51, 2).
	if o.hostile >= 0 && catalog[o.hostile].cut > 0 {
		o.cut = catalog[o.hostile].cut + time.Duration(r2.IntN(1700))*time.Millisecond
	}
	if c.database && r2.IntN(50) == 0 {
		o.burst, o.cut = true, time.Duration(500+r2.IntN(1500))*time.Millisecond
	}
	if c.replicas {
		o.hRO, o.pRO = !o.write && r2.IntN(2) == 0, r2.IntN(3) > 0
	}
	if c.holdLimits && r2.IntN(3) == 0 {
		o.drawHeld(r2)
	}
	return o
}

// opCtx is the context of one phase of o: the tenant, the class, and the
// deadline or cancellation drawn for it; a generous bound otherwise.
func (rc *runCtx) opCtx(o op, d time.Duration, cancel bool) (context.Context, context.CancelFunc) {
	ctx := tenantdb.WithTenant(rc.ctx, rc.env.tenants[o.tenant])
	if o.class > 0 {
		ctx = tenantdb.WithClass(ctx, classNames[o.class])
	}
	if d == 0 {
		return context.WithTimeout(ctx, 20*time.Second)
	}
	if cancel {
		ctx, c := context.WithCancel(ctx)
		t := time.AfterFunc(d, c)
		return ctx, func() { t.Stop(); c() }
	}
	return context.WithTimeout(ctx, d)
}

// exec runs o and checks it; it returns the violations found.
func (rc *runCtx) exec(o op) []string {
	if o.badRole {
		return rc.execBadRole(o)
	}
	if o.burst {
		return rc.execBurst(o)
	}
	tenant := rc.env.tenants[o.tenant]
	var bad []string
	started := time.Now()
	if o.held != heldNone {
		// The op's deadline or cancellation, if drawn, races the limits.
		ctx, cancel := rc.opCtx(o, o.deadline, o.cancel)
		bad = append(bad, rc.run(ctx, o, o.hVia, func(ctx context.Context) []string {
			if o.hRO {
				ctx = tenantdb.ReadOnly(ctx)
			}
			return rc.sendHeld(ctx, o)
		})...)
		cancel()
	} else if o.hostile >= 0 || o.write {
		var h *hostile
		sqlText := ""
		var args []any
		if o.hostile >= 0 {
			h = &catalog[o.hostile]
			rc.hostiles.Add(1)
			for _, s := range h.sticky {
				rc.markSticky(tenant, s)
			}
			if h.endsSession {
				rc.faultUntil(time.Now().Add(3 * time.Second))
			}
			if h.roleDefaults {
				rc.markRoleDefaults()
			}
			sqlText = h.render(tenant, o.tenant, tenantDatabase(rc.env.tenants[(o.tenant+1)%numTenants]))
		} else {
			sqlText = "insert into items (tenant, n) values ($1, $2) returning db, usr"
			args = []any{tenant, rc.runID}
		}
		d, c := o.deadline, o.cancel
		if h != nil && o.cut > 0 && (d == 0 || d > o.cut) {
			d, c = o.cut, false
		}
		ctx, cancel := rc.opCtx(o, d, c)
		bad = append(bad, rc.run(ctx, o, o.hVia, func(ctx context.Context) []string {
			if o.hRO {
				ctx = tenantdb.ReadOnly(ctx)
			}
			err, extra := rc.send(ctx, o, o.hPath, sqlText, args, o.write)
			if m := rc.judgeErr(ctx, tenant, err, h != nil, h, started); m != "" {
				extra = append(extra, "first statement: "+m)
			}
			return extra
		})...)
		cancel()
	}
	ctx, cancel := rc.opCtx(o, o.probeDL, false)
	defer cancel()
	bad = append(bad, rc.run(ctx, o, o.pVia, func(ctx context.Context) []string {
		switch {
		case o.pRO && o.pPath == pathTx && o.nonce&1 == 0:
			ctx = context.WithValue(ctx, txReadOnlyKey{}, true) // BeginTx with AccessMode ReadOnly, no mark
		case o.pRO:
			ctx = tenantdb.ReadOnly(ctx)
		}
		var r probeResult
		err := rc.probe(ctx, o, &r)
		if m := rc.judgeErr(ctx, tenant, err, false, nil, started); m != "" {
			return []string{"probe: " + m}
		}
		if err == nil {
			if txReadOnly(ctx) {
				// Its own BEGIN READ ONLY, on the primary it fell back to.
				r.stickyVisible = strings.Trim(strings.ReplaceAll(","+r.stickyVisible+",", ",rt,", ","), ",")
			}
			return append(rc.checkProbe(tenant, o.nonce, r), rc.checkWhere(ctx, r)...)
		}
		return nil
	})...)
	return bad
}

// send sends one statement (hostile, or a write whose returned db and usr
// are checked) by path p; the slice holds violations it saw on the way
// (a released Conn that still works, a write that landed elsewhere).
func (rc *runCtx) send(ctx context.Context, o op, p path, q string, args []any, write bool) (error, []string) {
	tenant := rc.env.tenants[o.tenant]
	var bad []string
	checkRow := func(db, usr string) {
		want := rc.cfg.expected(rc.env, tenant)
		if db != want.database {
			bad = append(bad, fmt.Sprintf("write landed in database %q, not %q", db, want.database))
		}
		for _, t := range tagRE.FindAllString(usr, -1) {
			if t != tag(tenant) {
				bad = append(bad, fmt.Sprintf("write ran as %q", usr))
			}
		}
	}
	row := func(scan func(...any) error) error {
		if !write {
			var v any
			return scan(&v)
		}
		var db, usr string
		err := scan(&db, &usr)
		if err == nil {
			checkRow(db, usr)
		}
		return err
	}
	switch p {
	case pathExec:
		_, err := rc.pool.Exec(ctx, q, args...)
		return err, bad
	case pathQuery:
		rows, err := rc.pool.Query(ctx, q, args...)
		if err != nil {
			return err, bad
		}
		for rows.Next() {
			if write {
				var db, usr string
				if rows.Scan(&db, &usr) == nil {
					checkRow(db, usr)
				}
			}
		}
		rows.Close()
		return rows.Err(), bad
	case pathQueryRow:
		err := row(rc.pool.QueryRow(ctx, q, args...).Scan)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		return err, bad
	case pathBatch:
		b := &pgx.Batch{}
		b.Queue(q, args...)
		br := rc.pool.SendBatch(ctx, b)
		err := row(br.QueryRow().Scan)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err, bad
	case pathTx:
		tx, err := rc.pool.Begin(ctx)
		if err != nil {
			return err, bad
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if _, err := tx.Exec(ctx, "savepoint s1"); err != nil {
			return err, bad
		}
		err = row(tx.QueryRow(ctx, q, args...).Scan)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		if err != nil {
			if _, rerr := tx.Exec(ctx, "rollback to savepoint s1"); rerr != nil {
				return err, bad
			}
		}
		if cerr := tx.Commit(ctx); err == nil {
			err = cerr
		}
		return err, bad
	case pathAcquire:
		c, err := rc.pool.Acquire(ctx)
		if err != nil {
			return err, bad
		}
		copyOf := c
		err = row(c.QueryRow(ctx, q, args...).Scan)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		c.Release()
		// With a context already ended: a statement that tenantdb lets
		// through reaches pgx's connection while another holder (or the
		// reset at release) uses it, and pgx may panic the whole checker
		// ("slow write timer already active", seen with issue 31, 1
		// reintroduced). tenantdb must refuse it before pgx sees it.
		ended, end := context.WithCancel(ctx)
		end()
		if _, uerr := copyOf.Exec(ended, "select 1"); !errors.Is(uerr, tenantdb.ErrConnReleased) {
			bad = append(bad, fmt.Sprintf("a copy of a released Conn ran a statement: %v", uerr))
		}
		return err, bad
	case pathConnTx:
		return rc.sendConnTx(ctx, o, q, args, row, bad)
	case pathSQL:
		if write {
			var db, usr string
			err := rc.db.QueryRowContext(ctx, q, args...).Scan(&db, &usr)
			if err == nil {
				checkRow(db, usr)
			}
			return err, bad
		}
		_, err := rc.db.ExecContext(ctx, q, args...)
		return err, bad
	case pathCopy:
		_, err := rc.pool.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"tenant", "n"},
			pgx.CopyFromRows([][]any{{tenant, rc.runID}, {tenant, rc.runID}}))
		return err, bad
	}
	return nil, bad
}

// sendConnTx sends q inside a transaction of SQL statements on a Conn, as
// a user of a Conn may: BEGIN, SAVEPOINT, q, and after q's own error
// ROLLBACK TO SAVEPOINT, then COMMIT. q's error is returned; the others are
// judged here, and only q may fail of its own: a failed transaction must
// take the statements that end or mend it (issue 31, 3).
func (rc *runCtx) sendConnTx(ctx context.Context, o op, q string, args []any, row func(func(...any) error) error, bad []string) (error, []string) {
	tenant := rc.env.tenants[o.tenant]
	var h *hostile
	if o.hostile >= 0 {
		h = &catalog[o.hostile]
	}
	started := time.Now()
	c, err := rc.pool.Acquire(ctx)
	if err != nil {
		return err, bad
	}
	defer c.Release()
	// step sends stmt and judges its error, which it returns.
	step := func(stmt string) error {
		_, err := c.Exec(ctx, stmt)
		if err != nil {
			if m := rc.judgeErr(ctx, tenant, err, false, h, started); m != "" {
				bad = append(bad, stmt+": "+m)
			}
		}
		return err
	}
	// over reports whether err ended the session or the call: nothing to
	// mend then. Otherwise an open transaction is rolled back, as a user's
	// code does: pgxpool would close a connection released in one.
	over := func(err error) bool {
		var pgErr *pgconn.PgError
		return ctx.Err() != nil || connLost(err) || !errors.As(err, &pgErr) || pgErr.Severity == "FATAL"
	}
	if err := step("begin"); err != nil {
		return nil, bad
	}
	if err := step("savepoint s1"); err != nil {
		if !over(err) {
			step("rollback")
		}
		return nil, bad
	}
	err = row(c.QueryRow(ctx, q, args...).Scan)
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err != nil {
		if over(err) {
			return err, bad
		}
		if rerr := step("rollback to savepoint s1"); rerr != nil {
			if !over(rerr) {
				step("rollback")
			}
			return err, bad
		}
	}
	if cerr := step("commit"); cerr != nil && !over(cerr) {
		step("rollback")
	}
	return err, bad
}

// probe runs the probe by o's probe path, with o's pgx option among its
// arguments.
func (rc *runCtx) probe(ctx context.Context, o op, r *probeResult) error {
	args := []any{o.nonce}
	if m := modes[o.mode]; m != nil {
		args = []any{m, o.nonce}
	}
	scanOne := func(rows pgx.Rows, err error) error {
		if err != nil {
			return err
		}
		defer rows.Close()
		if !rows.Next() {
			if rows.Err() != nil {
				return rows.Err()
			}
			return pgx.ErrNoRows
		}
		if err := rows.Scan(r.dest()...); err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	switch o.pPath {
	case pathQuery:
		return scanOne(rc.pool.Query(ctx, probeSQL, args...))
	case pathBatch:
		b := &pgx.Batch{}
		b.Queue(probeSQL, o.nonce)
		br := rc.pool.SendBatch(ctx, b)
		err := br.QueryRow().Scan(r.dest()...)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	case pathTx:
		var opts pgx.TxOptions
		if txReadOnly(ctx) {
			opts.AccessMode = pgx.ReadOnly // routed as a ReadOnly mark is (docs/servers.md)
		}
		tx, err := rc.pool.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if _, err := tx.Exec(ctx, "savepoint p1"); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, probeSQL, args...).Scan(r.dest()...); err != nil {
			return err
		}
		return tx.Commit(ctx)
	case pathAcquire:
		c, err := rc.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		return c.QueryRow(ctx, probeSQL, args...).Scan(r.dest()...)
	case pathSQL:
		return rc.db.QueryRowContext(ctx, probeSQL, o.nonce).Scan(r.dest()...)
	default:
		return rc.pool.QueryRow(ctx, probeSQL, args...).Scan(r.dest()...)
	}
}
