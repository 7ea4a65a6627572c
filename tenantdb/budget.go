package tenantdb

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// budget bounds the connections open to the server across the databases
// of a Pool with Config.Database: every connection is counted from before
// its dial until its server process has ended. When the budget is spent, a
// connection that needs to open closes an idle one of the least recently
// used database first, so idle connections move to where the work is. It
// admits nothing: the gate does, with the budget as its capacity, so the
// connections in use never exceed it either.
type budget struct {
	max  int
	dbs  *databases
	mu   sync.Mutex
	open int           // guarded by mu
	wake chan struct{} // guarded by mu; closed when a connection closes or goes idle

	waiting atomic.Int32 // connections waiting in reserve for room
}

// errNoRoom is matched by the error of a connect whose wait for room in
// the budget ended with its context.
var errNoRoom = errors.New("tenantdb: no room in the connection budget of Config.Database")

// pollRoom is how often a connection waiting for room looks for an idle
// connection again, for the releases that do not wake it (calls on
// Pool.Pgxpool, connections released by pgxpool itself).
const pollRoom = 20 * time.Millisecond

// closeWait bounds how long closing a connection waits for its server
// process to end; its room comes back only then.
const closeWait = 5 * time.Second

func newBudget(max int, dbs *databases) *budget {
	return &budget{max: max, dbs: dbs, wake: make(chan struct{})}
}

// reserve takes room for one connection to db, closing an idle connection
// of another database when the budget is spent. ctx (the connect's)
// bounds the wait.
func (b *budget) reserve(ctx context.Context, db *database) error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		b.mu.Lock()
		if b.open < b.max {
			b.open++
			b.mu.Unlock()
			return nil
		}
		wake := b.wake
		b.mu.Unlock()
		if b.dbs.closeIdle(db) {
			continue // its room came back when it closed; take it, or look again
		}
		if timer == nil {
			timer = time.NewTimer(pollRoom)
		} else {
			timer.Reset(pollRoom)
		}
		b.waiting.Add(1)
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			b.waiting.Add(-1)
			return fmt.Errorf("%w (%d connections): %w", errNoRoom, b.max, ctx.Err())
		}
		b.waiting.Add(-1)
	}
}

// give returns the room of a connection that closed (or never opened).
func (b *budget) give() {
	b.mu.Lock()
	b.open--
	b.signalLocked()
	b.mu.Unlock()
}

// idled tells connections waiting for room that one may have gone idle.
func (b *budget) idled() {
	if b.waiting.Load() == 0 {
		return
	}
	b.mu.Lock()
	b.signalLocked()
	b.mu.Unlock()
}

func (b *budget) signalLocked() {
	close(b.wake)
	b.wake = make(chan struct{})
}

// opened returns how many connections are open or opening.
func (b *budget) opened() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// connDial returns the DialFunc of one connection to db, which dials with
// next; pgxpool's BeforeConnect installs a new one in each connection's
// config. A dial while the connection is being opened takes room in the
// budget (a fallback host or an attempt without TLS takes its own, as the
// one before gave its room back); a dial once it is open, or while its
// socket is, is a cancel request: that needs no room, since the server
// counts no connection for it, and goes out at once.
func (b *budget) connDial(db *database, next pgconn.DialFunc) pgconn.DialFunc {
	if next == nil {
		next = (&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext // pgconn's default
	}
	d := &connDial{b: b, db: db, next: next}
	return d.dial
}

// connDial is the dialer of one connection.
type connDial struct {
	b      *budget
	db     *database
	next   pgconn.DialFunc
	mu     sync.Mutex
	live   *countedConn // guarded by mu: the socket dialled for the connection, until its Close
	opened bool         // guarded by mu: the connection is open (logged in)
}

func (d *connDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	cancelRequest := d.opened || d.live != nil
	d.mu.Unlock()
	if cancelRequest {
		return d.next(ctx, network, addr)
	}
	start := time.Now()
	if err := d.b.reserve(ctx, d.db); err != nil {
		return nil, err
	}
	c, err := d.next(ctx, network, addr)
	if err != nil {
		d.b.give()
		return nil, err
	}
	d.db.open.Add(1)
	cc := &countedConn{Conn: c, b: d.b, db: d.db, d: d, start: start, drained: make(chan struct{})}
	d.mu.Lock()
	d.live = cc
	d.mu.Unlock()
	return cc, nil
}

// open marks the connection open: every later dial is a cancel request.
func (d *connDial) open() {
	d.mu.Lock()
	d.opened = true
	d.mu.Unlock()
}

// countedConn is a connection counted in the budget until its server
// process has ended.
type countedConn struct {
	net.Conn
	b       *budget
	db      *database
	d       *connDial
	start   time.Time   // when its dial asked for room
	ready   atomic.Bool // logged in: its close counts as one
	closed  atomic.Bool
	once    sync.Once
	drained chan struct{} // closed when the server has closed its side and the room is back
}

// Close tells the server the connection is done (pgx has sent Terminate
// before; the end of the stream says it too, after a failed login) and
// counts the connection until the server closes its side, which
// PostgreSQL does only once the process has ended and left
// pg_stat_activity: so that the server never counts more connections
// than the budget. It waits for that up to closeWait; the room comes back
// when it happens, however long the server process takes to end (a
// statement nobody cancelled runs to its end first).
func (c *countedConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		err = nil
		c.closed.Store(true)
		c.d.mu.Lock()
		if c.d.live == c {
			c.d.live = nil
		}
		c.d.mu.Unlock()
		go c.drain()
		wait := time.NewTimer(closeWait)
		defer wait.Stop()
		select {
		case <-c.drained:
		case <-wait.C:
		}
	})
	return err
}

// drain half-closes the socket, reads it to its end and then returns the
// connection's room. Where the socket cannot be half-closed (a DialFunc's
// own net.Conn), the server may never see the end; the wait is then
// closeWait, as the room's count is then only a guess.
func (c *countedConn) drain() {
	defer close(c.drained)
	var deadline time.Time
	if hc, ok := c.Conn.(interface{ CloseWrite() error }); !ok || hc.CloseWrite() != nil {
		deadline = time.Now().Add(closeWait)
	}
	for {
		_ = c.Conn.SetReadDeadline(deadline) // pgx's deadlines no longer reach it: see SetDeadline
		_, err := io.Copy(io.Discard, c.Conn)
		var ne net.Error
		if !deadline.IsZero() || !errors.As(err, &ne) || !ne.Timeout() {
			break
		}
		// A deadline pgx set as the connection closed: read on.
	}
	_ = c.Conn.Close()
	c.db.open.Add(-1)
	if c.ready.Load() {
		c.db.closes.Add(1)
		c.b.dbs.totals.closes.Add(1)
	}
	c.b.give()
}

// SetDeadline, SetReadDeadline and SetWriteDeadline do nothing once the
// connection is closed: pgx clears its deadlines after a Close, which
// would end the drain's read.
func (c *countedConn) SetDeadline(t time.Time) error {
	if c.closed.Load() {
		return nil
	}
	return c.Conn.SetDeadline(t)
}

func (c *countedConn) SetReadDeadline(t time.Time) error {
	if c.closed.Load() {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *countedConn) SetWriteDeadline(t time.Time) error {
	if c.closed.Load() {
		return nil
	}
	return c.Conn.SetWriteDeadline(t)
}

// counted returns the countedConn under a pgconn's connection (TLS or
// not), or nil.
func counted(c net.Conn) *countedConn {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	cc, _ := c.(*countedConn)
	return cc
}
