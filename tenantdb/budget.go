package tenantdb

import (
	"context"
	"crypto/tls"
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

// pollRoom is how often a connection waiting for room looks for an idle
// connection again, for the releases that do not wake it (calls on
// Pool.Pgxpool, connections released by pgxpool itself).
const pollRoom = 20 * time.Millisecond

// closeWait bounds how long closing a connection waits for its server
// process to end before the connection is counted out anyway.
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
			return ctx.Err()
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

// dial wraps a database's DialFunc: it takes room in the budget before
// dialling and counts the connection until its Close.
func (b *budget) dial(db *database, next pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		start := time.Now()
		if err := b.reserve(ctx, db); err != nil {
			return nil, err
		}
		c, err := next(ctx, network, addr)
		if err != nil {
			b.give()
			return nil, err
		}
		db.open.Add(1)
		return &countedConn{Conn: c, b: b, db: db, start: start}, nil
	}
}

// countedConn is a connection counted in the budget until it is closed.
type countedConn struct {
	net.Conn
	b     *budget
	db    *database
	start time.Time   // when its dial asked for room
	ready atomic.Bool // logged in: its close counts as one
	once  sync.Once
}

// Close waits (up to closeWait) for the server to close its side, which
// it does once its process has ended (after a Terminate, or after a
// failed login), then closes the connection and returns its room: so that
// the server never counts more connections than the budget.
func (c *countedConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		_ = c.Conn.SetReadDeadline(time.Now().Add(closeWait))
		_, _ = io.Copy(io.Discard, c.Conn)
		err = c.Conn.Close()
		c.db.open.Add(-1)
		if c.ready.Load() {
			c.db.closes.Add(1)
			c.b.dbs.totals.closes.Add(1)
		}
		c.b.give()
	})
	return err
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
