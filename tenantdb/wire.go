package tenantdb

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// wireConn is the network connection under each shared pgx connection. It
// lets the reset of a change of tenant travel in the same round trip as the
// statement after it: arm queues the reset's messages, the next write sends
// them in front of pgx's own, and the replies to them are read off the stream
// before pgx sees it. It also counts the named statements pgx prepares and
// closes, so that the reset can tell whether a holder's SQL changed them.
//
// The reset is sent as extended-protocol messages without a Sync of its own
// when pgx's write is extended-protocol too: an error in the reset then makes
// the server skip pgx's messages up to their Sync, so the statement never
// runs in a session that was not reset, and the error is passed to pgx as
// the statement's. Before a simple-protocol query (or a read with nothing
// written), the reset goes alone, with a Sync, in a round trip of its own,
// and a failure fails the write, which closes the connection.
type wireConn struct {
	net.Conn

	mu       sync.Mutex // guards the fields below, shared by readers and writers
	prefix   []byte     // the armed reset, until it is written
	discards bool       // the armed reset drops the server's prepared statements
	awaiting bool       // the reset was written; its replies are not all read
	execs    int        // replies of the reset's statements not yet read (CommandComplete)
	synced   bool       // the reset carries its own Sync: read up to ReadyForQuery
	values   bool       // the armed statements only set the owner's values again
	riding   bool       // values went with a simple query: a failure cannot stop it
	failed   error      // why the last reset failed, until settle reports it
	watch    bool       // the reset succeeded; its transaction has not ended
	owner    string     // the tenant whose pristine session the connection holds
	owned    bool       // owner is known: false for a new or unknown session
	pending  string     // the owner once the armed reset succeeds
	carried  string     // the values statement that set the owner's values on the session ("" for none)
	pendingV string     // carried once the armed statements succeed
	used     bool       // a holder has had the connection
	stale    bool       // the last reset failed or was rolled back and none succeeded since: no write goes out
	skipped  bool       // the last reset failed in front of a statement, which the server skipped
	undone   bool       // the watched transaction met an error or a ROLLBACK: the reset goes unless it commits

	// pgx's named statements, which the wire re-creates after a reset (see
	// statements.go), and the replies owed for what was written since.
	stmts     map[string]*namedStatement
	epoch     int     // counts the resets that dropped the server's statements
	replies   []reply // from replyHead on: owed, oldest first
	replyHead int
	poisoned  error  // a re-created statement's columns changed: its group's replies become this error
	untracked bool   // a write could not be read: statements are not re-created until the next reset
	startup   bool   // pgx's next message is the untyped startup message
	scanLeft  int    // bytes of a message of pgx's that an earlier write began, still to come
	columns   []byte // scratch for the columns of a description being compared
	held      []byte // notifications read after every reply owed; dropped by a change of tenant

	reading  bool      // a reader owns rbuf, out and the pass fields; guarded by mu
	cond     sync.Cond // on mu: signalled when reading or awaiting ends
	rbuf     []byte    // bytes read from Conn, not yet parsed, in rstore; the reader's only
	rstore   []byte    // the buffer rbuf reads into; the reader's only
	out      []byte    // parsed bytes for pgx; the reader's only
	passLeft int       // bytes of a streamed message (rows, copy data) still to come; the reader's only
	passDrop bool      // the streamed message is dropped; the reader's only
}

// wrapWire is the pgconn AfterNetConnect hook: it wraps conn, after TLS.
func wrapWire(own func(context.Context, *pgconn.Config, net.Conn) (net.Conn, error)) func(context.Context, *pgconn.Config, net.Conn) (net.Conn, error) {
	return func(ctx context.Context, cfg *pgconn.Config, conn net.Conn) (net.Conn, error) {
		if own != nil {
			var err error
			if conn, err = own(ctx, cfg, conn); err != nil {
				return nil, err
			}
		}
		w := &wireConn{Conn: conn, startup: true, stmts: map[string]*namedStatement{}}
		w.cond.L = &w.mu
		return w, nil
	}
}

// wireOf returns the wireConn under c, or nil.
func wireOf(c net.Conn) *wireConn {
	w, _ := c.(*wireConn)
	return w
}

var errResetNotConfirmed = errors.New("tenantdb: the session reset was not confirmed by the server")

// arm queues statements to run in front of the next write; execs is how many
// there are, values is the statement among them that sets the tenant's
// values ("" for none), and discards tells whether they drop the server's
// prepared statements. The session belongs to tenant once they succeed.
func (w *wireConn) arm(msgs []byte, execs int, tenant, values string, discards bool) {
	w.mu.Lock()
	w.prefix, w.execs, w.pending, w.owned, w.used, w.discards = msgs, execs, tenant, false, true, discards
	if discards {
		w.held = nil // the previous holder's notifications
	}
	w.pendingV = values
	w.awaiting, w.synced, w.failed, w.values, w.riding = false, false, nil, false, false
	w.stale, w.skipped, w.undone = false, false, false
	w.mu.Unlock()
}

// armValues is arm for statements that only set again the values of the
// tenant that owns the session. They go with the next write, whatever its
// protocol, with a Sync of their own: they hold even if the statement after
// them fails, and if they fail, the statement runs in that tenant's own
// session, and the next acquire resets it.
func (w *wireConn) armValues(msgs []byte, execs int, tenant, values string) {
	w.arm(msgs, execs, tenant, values, false)
	w.mu.Lock()
	w.values = true
	w.mu.Unlock()
}

// own records that the session belongs to tenant without any statement.
func (w *wireConn) own(tenant string) {
	w.mu.Lock()
	w.owner, w.owned, w.used = tenant, true, true
	w.mu.Unlock()
}

// state returns the owner of the session, whether it is known, whether
// any holder had the connection, and the values statement the session ran
// for its owner.
func (w *wireConn) state() (owner string, owned, used bool, carried string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.prefix != nil || w.awaiting || w.watch { // an earlier reset never completed
		w.prefix, w.awaiting, w.watch, w.owned = nil, false, false, false
	}
	return w.owner, w.owned, w.used, w.carried
}

// armed reports whether a reset waits for the next write.
func (w *wireConn) armed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.prefix != nil
}

// resetArmed reports whether a reset waits for the next write.
func (w *wireConn) resetArmed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.prefix != nil && w.discards
}

// armedValuesOnly reports whether what waits for the next write only sets
// the owner's values again, which go with any write (see armValues).
func (w *wireConn) armedValuesOnly() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.prefix != nil && w.values
}

// untrackedStatements reports whether the wire lost track of pgx's
// statements and, if so, starts tracking them afresh: the caller empties
// pgx's caches, so that pgx prepares each statement again itself.
func (w *wireConn) untrackedStatements() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.untracked {
		return false
	}
	w.untracked, w.scanLeft = false, 0 // the connection is idle: pgx's next write starts a message
	clear(w.stmts)
	return true
}

// sending takes the armed reset for a write: its replies are awaited from
// now on, and the statements it drops are lost to the server. Called with mu
// held; prefix is nil when nothing is armed.
func (w *wireConn) sending(synced bool) (prefix []byte) {
	prefix = w.prefix
	if prefix == nil {
		return nil
	}
	w.prefix, w.awaiting, w.synced = nil, true, synced
	if w.discards {
		w.epoch++
	}
	return prefix
}

// errStaleSession fails a write to a session whose reset failed: see
// wireConn.stale.
var errStaleSession = errors.New("tenantdb: the session reset failed and the connection was not reset since; it is closed")

// isSkipped reports whether the last reset failed in front of a statement
// (which the server skipped) and none was armed since: the session still
// holds the previous holder's state, and a quick reset would fail again.
func (w *wireConn) isSkipped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.skipped
}

// Write sends p, with the armed reset in front of it. Once a reset sent in
// front of a statement failed, or was rolled back with the statements of
// its transaction (see watchReply), nothing is sent until the connection is
// reset again (slowReset, or readySession's arm): pgx fails the statement
// and closes the connection, which may hold the previous holder's session.
// Only Pool's calls settle and recover a failed reset; a statement sent
// after it by an adapter (tenantsql, on the same connection) or through
// Pool.Pgxpool would otherwise run in that session.
func (w *wireConn) Write(p []byte) (int, error) {
	n := len(p)
	w.mu.Lock()
	if w.stale && (len(p) == 0 || p[0] != 'X') {
		w.mu.Unlock()
		return 0, errStaleSession
	}
	extended := len(p) > 0 && isExtended(p[0])
	var prefix []byte
	riding := false
	if w.prefix != nil && (extended || len(p) == 0 || p[0] != 'X') {
		riding = w.values
		prefix = w.sending(!extended || riding)
		w.riding = riding
	} else if w.prefix != nil { // Terminate: nothing to reset
		w.prefix = nil
	}
	if prefix == nil || extended || riding {
		p = w.trackWrite(p)
	}
	w.mu.Unlock()
	if prefix == nil {
		return w.write(p, n)
	}
	if riding {
		prefix, _ = (&pgproto3.Sync{}).Encode(append([]byte(nil), prefix...))
	} else if !extended {
		if err := w.flushAlone(prefix); err != nil {
			return 0, err
		}
		w.mu.Lock()
		p = w.trackWrite(p)
		w.mu.Unlock()
		return w.write(p, n)
	}
	buf := make([]byte, 0, len(prefix)+len(p))
	return w.write(append(append(buf, prefix...), p...), n)
}

// write writes msgs, which stand for the n bytes pgx asked to write.
func (w *wireConn) write(msgs []byte, n int) (int, error) {
	if _, err := w.Conn.Write(msgs); err != nil {
		return 0, err
	}
	return n, nil
}

// isExtended reports whether a frontend message type is part of the extended
// query protocol, whose errors skip the messages up to the next Sync.
func isExtended(t byte) bool {
	switch t {
	case 'P', 'B', 'D', 'E', 'S', 'C', 'H':
		return true
	}
	return false
}

// flushAlone sends prefix with a Sync and waits for its replies: a round
// trip of its own. It returns the reset's error. The replies are read by this
// call or by a read already in progress: pgx's background reader may be
// blocked in Read when pgx writes, and it sorts the reset's replies out as
// they arrive, so this call waits for it rather than for the read to end
// (which needs the statement this write is to send).
func (w *wireConn) flushAlone(prefix []byte) error {
	msgs, err := (&pgproto3.Sync{}).Encode(append([]byte(nil), prefix...))
	if err == nil {
		_, err = w.Conn.Write(msgs)
	}
	if err != nil {
		w.fail(err)
		return err
	}
	for {
		w.mu.Lock()
		for w.awaiting && w.reading {
			w.cond.Wait()
		}
		if !w.awaiting {
			err := w.failed
			w.mu.Unlock()
			return err
		}
		w.reading = true
		w.mu.Unlock()
		err := w.step()
		w.endRead()
		if err != nil {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.failed
		}
	}
}

// beginRead waits until no other reader owns rbuf and out, and takes them.
func (w *wireConn) beginRead() {
	w.mu.Lock()
	for w.reading {
		w.cond.Wait()
	}
	w.reading = true
	w.mu.Unlock()
}

// endRead gives rbuf and out back and wakes who waits for them.
func (w *wireConn) endRead() {
	w.mu.Lock()
	w.reading = false
	w.cond.Broadcast()
	w.mu.Unlock()
}

func (w *wireConn) isAwaiting() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.awaiting
}

// fail ends the reset in flight with err.
func (w *wireConn) fail(err error) {
	w.mu.Lock()
	if w.awaiting {
		w.awaiting, w.owned = false, false
		if w.failed == nil {
			w.failed = err
		}
		w.cond.Broadcast()
	}
	w.mu.Unlock()
}

// Read reads what pgx is to see: the server's stream less the replies to the
// reset.
func (w *wireConn) Read(p []byte) (int, error) {
	w.mu.Lock()
	prefix := w.sending(true) // a read before any write: the reset goes alone
	w.mu.Unlock()
	if prefix != nil {
		if err := w.flushAlone(prefix); err != nil {
			return 0, err
		}
	}
	w.beginRead()
	defer w.endRead()
	for len(w.out) == 0 && !w.releaseHeld() {
		// Always through step, which looks at the bytes only once they
		// have arrived: a read that began before a reset was written
		// still sorts the reset's replies out.
		if err := w.step(); err != nil {
			return 0, err
		}
	}
	n := copy(p, w.out)
	if n == len(w.out) {
		w.out = w.out[:0]
	} else {
		w.out = w.out[n:]
	}
	return n, nil
}

// releaseHeld passes the held notifications to pgx, which reads again
// while the session is still its holder's (a change of tenant drops them),
// and reports whether there were any. Called by the reader.
func (w *wireConn) releaseHeld() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.held) == 0 {
		return false
	}
	w.out = append(w.out, w.held...)
	w.held = w.held[:0]
	return true
}

// readSize is how much one read from the connection asks for at least.
const readSize = 8192

// step sorts the whole messages read so far or, with none, reads once from
// the connection: the reset's replies are dropped (ParameterStatus goes to
// pgx, which must know what the reset changed), and so are the replies to the
// messages that re-create pgx's statements (see sortReply); the rest is
// pgx's. Rows and copy data are passed on as they arrive. Called by the
// reader (beginRead).
func (w *wireConn) step() error {
	sorted := false
	for {
		if w.passLeft > 0 {
			if len(w.rbuf) == 0 {
				break
			}
			n := min(w.passLeft, len(w.rbuf))
			if !w.passDrop {
				w.out = append(w.out, w.rbuf[:n]...)
			}
			w.rbuf, w.passLeft, sorted = w.rbuf[n:], w.passLeft-n, true
			continue
		}
		if len(w.rbuf) < 5 {
			break
		}
		size := 1 + int(binary.BigEndian.Uint32(w.rbuf[1:5]))
		w.mu.Lock()
		awaiting := w.awaiting
		if !awaiting && (w.rbuf[0] == 'D' || w.rbuf[0] == 'd') {
			w.passLeft, w.passDrop = size, w.poisoned != nil
			w.mu.Unlock()
			continue
		}
		if len(w.rbuf) < size {
			w.mu.Unlock()
			break
		}
		msg := w.rbuf[:size]
		if awaiting {
			w.reply(msg)
		} else if msg[0] == 'A' && w.owed() == 0 && !w.untracked {
			// A notification after the last reply owed: pgx would buffer
			// it with that reply and hand it to the next holder. It waits
			// until pgx reads again (see releaseHeld).
			w.held = append(w.held, msg...)
		} else {
			kept := w.sortReply(msg)
			if w.watch {
				w.watchReplies(kept)
			}
			w.out = append(w.out, kept...)
		}
		w.mu.Unlock()
		w.rbuf, sorted = w.rbuf[size:], true
	}
	if sorted {
		return nil
	}
	if len(w.rbuf) == 0 {
		w.rbuf = w.rstore[:0]
	}
	if cap(w.rbuf)-len(w.rbuf) < readSize/2 { // move what is left to the front, growing the store if need be
		if need := len(w.rbuf) + readSize; cap(w.rstore) < need {
			w.rstore = make([]byte, 0, max(need, 2*cap(w.rstore)))
		}
		w.rbuf = append(w.rstore[:0], w.rbuf...)
	}
	n, err := w.Conn.Read(w.rbuf[len(w.rbuf):cap(w.rbuf)])
	w.rbuf = w.rbuf[:len(w.rbuf)+n]
	if err != nil && n == 0 {
		w.fail(err)
		return err
	}
	return nil
}

// reply handles one message of the server while the reset's replies are
// read. Called with mu held.
func (w *wireConn) reply(msg []byte) {
	defer w.cond.Broadcast() // awaiting may have ended: wake flushAlone
	switch msg[0] {
	case 'S': // ParameterStatus: the reset changed a reported setting
		w.out = append(w.out, msg...)
	case 'C':
		w.execs--
		if w.execs == 0 && !w.synced {
			w.done()
		}
	case 'E':
		var e pgproto3.ErrorResponse
		err := error(errResetNotConfirmed)
		if e.Decode(msg[5:]) == nil {
			err = pgconn.ErrorResponseToPgError(&e)
		}
		if w.failed == nil && !w.riding { // a riding query ran anyway: nothing to send again
			w.failed = fmt.Errorf("tenantdb: reset the session: %w", err)
		}
		w.owned = false
		if !w.synced {
			// The server skips pgx's messages up to their Sync: the
			// error is the statement's.
			w.out = append(w.out, msg...)
			w.awaiting, w.stale, w.skipped = false, true, true
			w.skipToSync()
		}
	case 'Z':
		if w.synced {
			w.awaiting = false
			if w.failed == nil && w.execs == 0 {
				w.done()
			}
		}
	}
	// Everything else (ParseComplete, BindComplete, DataRow, notices, the
	// previous holder's notifications) belonged to the reset: dropped.
}

// done records a reset that succeeded. Called with mu held. Unless it went
// alone, it shares its transaction with the statements sent after it: it
// holds only once that transaction commits, so the rest of it is watched
// (see watchReply).
func (w *wireConn) done() {
	w.awaiting, w.owner, w.owned, w.watch = false, w.pending, true, !w.synced
	w.carried = w.pendingV
}

// watchReplies looks at pgx's messages in msgs, in the transaction of a
// reset that travelled with pgx's statements. Called with mu held.
func (w *wireConn) watchReplies(msgs []byte) {
	for len(msgs) >= 5 {
		size := 1 + int(binary.BigEndian.Uint32(msgs[1:5]))
		w.watchReply(msgs[:size])
		msgs = msgs[size:]
	}
}

// watchReply looks at one of pgx's messages in the transaction of a reset
// that travelled with pgx's statements: an error or a ROLLBACK (as tag of a
// COMMIT too) undoes the reset, and the session's owner is then unknown;
// ReadyForQuery outside a transaction ends the watch. Called with mu held.
func (w *wireConn) watchReply(msg []byte) {
	switch msg[0] {
	case 'E':
		w.owned, w.undone = false, true
	case 'C':
		if bytes.HasPrefix(msg[5:], []byte("ROLLBACK")) {
			w.owned, w.undone = false, true
		} else if bytes.HasPrefix(msg[5:], []byte("COMMIT")) {
			w.undone = false
		}
	case 'Z':
		if len(msg) > 5 && msg[5] == 'I' {
			// Rolled back, the reset is gone and the session is the
			// previous holder's again: no statement of this holder's
			// may follow (see Write).
			w.watch, w.stale, w.undone = false, w.undone, false
		}
	}
}

// settle waits, within ctx, for the replies to a reset sent with the last
// statement, and returns its error: nil when none was sent or it succeeded.
// A reset still armed (the statement never reached the connection) is
// dropped, and the session's owner is then unknown.
func (w *wireConn) settle(ctx context.Context) error {
	w.mu.Lock()
	if w.prefix != nil {
		w.prefix, w.owned = nil, false
	}
	awaiting := w.awaiting
	w.mu.Unlock()
	if awaiting {
		w.beginRead()
		stop := context.AfterFunc(ctx, func() { _ = w.Conn.SetReadDeadline(time.Now()) })
		if d, ok := ctx.Deadline(); ok {
			_ = w.Conn.SetReadDeadline(d)
		}
		var err error
		for err == nil && w.isAwaiting() {
			err = w.step()
		}
		stop()
		_ = w.Conn.SetReadDeadline(time.Time{})
		w.endRead()
		w.dropIfOutOfStep(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.failed
	w.failed = nil
	return err
}

// send sends the armed reset alone, with a Sync, within ctx, and returns
// its error: nil when none was armed or it succeeded.
func (w *wireConn) send(ctx context.Context) error {
	w.mu.Lock()
	prefix := w.sending(true)
	w.mu.Unlock()
	if prefix == nil {
		return nil
	}
	stop := context.AfterFunc(ctx, func() { _ = w.Conn.SetDeadline(time.Now()) })
	if d, ok := ctx.Deadline(); ok {
		_ = w.Conn.SetDeadline(d)
	}
	err := w.flushAlone(prefix)
	stop()
	_ = w.Conn.SetDeadline(time.Time{})
	w.dropIfOutOfStep(err)
	w.mu.Lock()
	w.failed = nil
	w.mu.Unlock()
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// dropIfOutOfStep closes the network connection when err, met while the
// reset's replies were read, leaves the stream at an unknown place: pgx then
// fails on it and pgxpool destroys it. A server's error leaves it in step.
func (w *wireConn) dropIfOutOfStep(err error) {
	var pgErr *pgconn.PgError
	if err != nil && !errors.As(err, &pgErr) {
		_ = w.Conn.Close()
	}
}
