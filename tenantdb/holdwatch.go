package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/pool"
)

// ErrIdleInTransaction is matched by every use of a Tx, or of a Conn and
// what it handed out, after tenantdb ended it because its holder had sent
// nothing for its tenant's IdleInTransactionTimeout (pool.Plan's, a
// Lookup's, a class's) while a transaction was open: the transaction was
// rolled back and its connection and slot returned, without closing the
// server session. The error of a Tx also matches pgx.ErrTxClosed, that of
// a Conn ErrConnReleased.
var ErrIdleInTransaction = errors.New("tenantdb: the transaction was idle longer than its tenant's IdleInTransactionTimeout, " +
	"and was rolled back")

// ErrMaxHold is matched by every use of a Tx, or of a Conn and what it
// handed out, after tenantdb ended it because it was held longer than its
// tenant's MaxHold: rolled back and returned as for ErrIdleInTransaction.
var ErrMaxHold = errors.New("tenantdb: held longer than its tenant's MaxHold, and rolled back")

// endRollbackTimeout bounds the rollback of a hold that a time limit ends;
// past it, the connection is closed (pgx's context handling) and pgxpool
// destroys it.
const endRollbackTimeout = 5 * time.Second

// holdWatch ends a Tx or Conn for its permit's IdleInTransactionTimeout
// and MaxHold: it rolls back the transaction, returns the connection and
// the slot, and fails every later use. A rollback is enough, so the server
// session stays (PostgreSQL's idle_in_transaction_session_timeout would
// end it).
//
// It never touches the connection while its holder does: every call on the
// Tx or Conn (and the rows, row or batch a call hands out, until they are
// done) counts in busy, a hold is ended only while busy is 0, and ended,
// set under mu by whoever ends the hold first (the holder's Commit,
// Rollback or Release, or the watch), makes every later call fail before
// it touches the connection. So it never rolls back a transaction a
// statement uses, and never touches a connection after its release. A
// hold past MaxHold during a call ends when the call is done: a running
// statement is not interrupted (StatementTimeout bounds it).
type holdWatch struct {
	idle, max time.Duration
	start     time.Time
	permit    pool.Permit    // the hold's, whose limits these are
	pc        *pgconn.PgConn // the held connection
	release   func()         // returns the connection and the slot, as the holder would
	ref       liveRef        // the Conn's life, ended with it; zero for a Tx
	closedErr error          // a use after its holder ended it: ErrConnReleased, pgx.ErrTxClosed, ...

	mu      sync.Mutex
	timer   *time.Timer // guarded by mu
	busy    int         // guarded by mu: the holder's calls in progress, and rows, rows or batches not yet done
	last    time.Time   // guarded by mu: when the holder last sent something (its last call was done)
	ended   bool        // guarded by mu: by its holder or by the watch
	err     error       // guarded by mu: why the watch ended it, nil while it did not
	overdue bool        // guarded by mu: MaxHold passed during a call, which ends the hold when it is done
	off     bool        // guarded by mu: the holder took pgx's connection itself: the watch can tell nothing
}

// watchHold returns a watch over h for its permit's limits, or nil, at no
// cost, when it has none. ref is the Conn's life (zero for a Tx), and
// closedErr what a use after the holder ended the hold fails with.
func watchHold(h *held, ref liveRef, closedErr error) *holdWatch {
	if !hasHoldLimits(h.permit) || h.conn == nil {
		return nil
	}
	return watchHeld(*h, ref, closedErr)
}

// watchHeld is watchHold's watch, which releases h, a copy of its own. A
// function apart, so that only a hold with limits moves h to the heap (the
// closure's capture would move it on entry to watchHold, for every hold).
func watchHeld(h held, ref liveRef, closedErr error) *holdWatch {
	return newHoldWatch(h.permit, h.conn.Conn().PgConn(), func() { h.release(nil) }, ref, closedErr)
}

// hasHoldLimits reports whether permit's work has an
// IdleInTransactionTimeout or a MaxHold.
func hasHoldLimits(permit pool.Permit) bool {
	return permit.IdleInTransactionTimeout() > 0 || permit.MaxHold() > 0
}

// newHoldWatch starts a watch over pc, held under permit, that release
// returns.
func newHoldWatch(permit pool.Permit, pc *pgconn.PgConn, release func(), ref liveRef, closedErr error) *holdWatch {
	idle, max := permit.IdleInTransactionTimeout(), permit.MaxHold()
	now := time.Now()
	w := &holdWatch{idle: idle, max: max, start: now, permit: permit, pc: pc, release: release, ref: ref, closedErr: closedErr, last: now}
	w.mu.Lock()
	w.timer = time.AfterFunc(w.nextLocked(now), w.fire)
	w.mu.Unlock()
	return w
}

// nextLocked is how long after now the watch looks again.
func (w *holdWatch) nextLocked(now time.Time) time.Duration {
	d := time.Duration(1<<63 - 1)
	if w.max > 0 {
		d = w.start.Add(w.max).Sub(now)
	}
	if w.idle > 0 {
		i := w.last.Add(w.idle).Sub(now)
		if w.busy > 0 || i <= 0 {
			// Busy: the idle time counts from the call's end. Idle but out
			// of a transaction: one that begins later begins with a call.
			i = w.idle
		}
		d = min(d, i)
	}
	return max(d, time.Millisecond)
}

// fire is the timer's: it ends the hold if a limit has passed and no call
// is in progress, marks it overdue if MaxHold passed during one, or looks
// again later.
func (w *holdWatch) fire() {
	w.mu.Lock()
	if w.ended || w.off {
		w.mu.Unlock()
		return
	}
	now := time.Now()
	limit, over := pool.LimitMaxHold, w.max > 0 && now.Sub(w.start) >= w.max
	if !over && w.idle > 0 && w.busy == 0 && now.Sub(w.last) >= w.idle && w.inTransactionLocked() {
		limit, over = pool.LimitIdleInTransaction, true
	}
	switch {
	case !over:
		w.timer.Reset(w.nextLocked(now))
		w.mu.Unlock()
	case w.busy > 0:
		w.overdue = true // only MaxHold passes while busy; leave ends it
		w.mu.Unlock()
	default:
		w.endLocked(limit, now)
		w.mu.Unlock()
		w.finish(limit)
	}
}

// inTransactionLocked reports whether the held connection is inside a
// transaction. Its holder is not using it: busy is 0.
func (w *holdWatch) inTransactionLocked() bool {
	return !w.pc.IsClosed() && w.pc.TxStatus() != txIdle
}

// endLocked marks the hold ended by limit at now.
func (w *holdWatch) endLocked(limit pool.TimeLimit, now time.Time) {
	w.ended = true
	w.timer.Stop()
	cause, after := ErrMaxHold, w.max
	if limit == pool.LimitIdleInTransaction {
		cause, after = ErrIdleInTransaction, w.idle
	}
	w.err = fmt.Errorf("%w (%v; held %v): %w", cause, after, now.Sub(w.start).Round(time.Millisecond), w.closedErr)
}

// finish ends the hold for limit, once no call is in progress and every
// later one fails: a rollback if a transaction is open (bounded by
// endRollbackTimeout), then the release of the connection and the slot.
func (w *holdWatch) finish(limit pool.TimeLimit) {
	w.permit.Exceeded(limit)
	pc := w.pc
	if !pc.IsClosed() && pc.TxStatus() != txIdle {
		ctx, cancel := context.WithTimeout(context.Background(), endRollbackTimeout)
		_, _ = pc.Exec(ctx, "rollback").ReadAll() // a failure closes the connection, which pgxpool destroys
		cancel()
	}
	w.ref.end()
	w.release()
}

// enter starts a call of the holder, or returns why there is none to make:
// the watch's error, or closedErr after the holder ended the hold.
func (w *holdWatch) enter() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return w.errLocked()
	}
	w.busy++
	return nil
}

// leave ends a call enter started; the hold ends now if MaxHold passed
// during it.
func (w *holdWatch) leave() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.busy--
	w.last = time.Now()
	if w.busy == 0 && w.overdue && !w.ended && !w.off {
		w.endLocked(pool.LimitMaxHold, w.last)
		w.mu.Unlock()
		w.finish(pool.LimitMaxHold)
		return
	}
	w.mu.Unlock()
}

// claim is the holder's end of the hold (Commit, Rollback, Release,
// Hijack): nil when the holder is to end it, else the error of a hold the
// watch, or an earlier claim, ended.
func (w *holdWatch) claim() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return w.errLocked()
	}
	w.ended = true
	w.timer.Stop()
	return nil
}

// disarm stops the watch for good: the holder has pgx's connection itself
// (Conn, LargeObjects), whose use the watch cannot see. It reports false
// when the hold had ended.
func (w *holdWatch) disarm() bool {
	if w == nil {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.off = true
	w.timer.Stop()
	return !w.ended
}

func (w *holdWatch) errLocked() error {
	if w.err != nil {
		return w.err
	}
	return w.closedErr
}
