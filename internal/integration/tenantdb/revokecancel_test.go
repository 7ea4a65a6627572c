package tenantdb_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/internal/integration/fakecluster"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// cancelCode is the code of PostgreSQL's CancelRequest message.
const cancelCode = 80877102

// cancelStaller dials PostgreSQL, and while stalling is on it holds back the
// CancelRequest packets written on the connections it dialed, as a slow
// network or a busy postmaster would: the sender sees no acknowledgement,
// and the server gets the packet when the test forwards it.
type cancelStaller struct {
	mu       sync.Mutex
	stalling bool
	held     []*stallConn
}

func (s *cancelStaller) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, s: s}, nil
}

type stallConn struct {
	net.Conn
	s       *cancelStaller
	written bool
	packet  []byte // a stalled CancelRequest
}

func (c *stallConn) Write(b []byte) (int, error) {
	first := !c.written
	c.written = true
	if first && len(b) >= 8 && binary.BigEndian.Uint32(b[4:8]) == cancelCode {
		c.s.mu.Lock()
		defer c.s.mu.Unlock()
		if c.s.stalling {
			c.packet = append([]byte(nil), b...)
			c.s.held = append(c.s.held, c)
			return len(b), nil
		}
	}
	return c.Conn.Write(b)
}

func (c *stallConn) Close() error {
	if c.packet != nil {
		return nil // kept open, for forward
	}
	return c.Conn.Close()
}

// forward stops stalling and sends the CancelRequests held back, each
// waiting for the server to close its connection: PostgreSQL has signalled
// the backend then.
func (s *cancelStaller) forward(t *testing.T) int {
	t.Helper()
	s.mu.Lock()
	s.stalling = false
	held := s.held
	s.held = nil
	s.mu.Unlock()
	for _, c := range held {
		_ = c.Conn.SetDeadline(time.Time{})
		if _, err := c.Conn.Write(c.packet); err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, c.Conn)
		c.Conn.Close()
	}
	return len(held)
}

func isQueryCanceled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}

// revokeAndRelease revokes c's cluster slot and releases c once the Conn
// refuses statements with ErrRevoked: the CancelRequest was sent then, and
// Release waits for it. ran, if not nil, ends the statement running on c
// when the slot is revoked.
func revokeAndRelease(t *testing.T, cluster *fakecluster.Revoker, c tenantdb.Conn, ran <-chan error) {
	t.Helper()
	cluster.RevokeAll()
	if ran != nil {
		if err := <-ran; err != nil && !errors.Is(err, tenantdb.ErrRevoked) {
			t.Fatalf("the revoked statement's error %v does not match ErrRevoked", err)
		}
	}
	eventually(t, "the Conn refuses statements after the revocation", func() bool {
		_, err := c.Exec(as("a"), "select 1")
		return errors.Is(err, tenantdb.ErrRevoked)
	})
	c.Release()
}

func TestRevocationCancelDoesNotReachTheNextStatement(t *testing.T) {
	// A revocation's CancelRequest, once PostgreSQL acknowledged it, does
	// not cancel the statement that the connection's next holder (the same
	// tenant here, on the one shared connection) runs: the server acts on
	// a cancel before it reads the next statement, and drops one that
	// finds the session idle. Revocations land while a statement runs, as
	// it ends and after it.
	cluster := &fakecluster.Revoker{}
	p := newPool(t, sharedPG, 1, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}}, Cluster: cluster})
	for i := range 40 {
		c, err := p.Acquire(as("a"))
		if err != nil {
			t.Fatal(err)
		}
		ran := make(chan error, 1)
		go func() { _, err := c.Exec(as("a"), "select pg_sleep($1::float8 / 1000)", i%4); ran <- err }()
		if i%2 == 0 {
			if err := <-ran; err != nil {
				t.Fatal(err)
			}
			ran = nil
		}
		revokeAndRelease(t, cluster, c, ran)
		if _, err := p.Exec(as("a"), "select pg_sleep(0.02)"); err != nil {
			if isQueryCanceled(err) {
				t.Fatalf("round %d: the revocation's cancel reached the next statement: %v", i, err)
			}
			t.Fatalf("round %d: %v", i, err)
		}
	}
	assertNothingHeld(t, p)
}

func TestUnacknowledgedRevocationCancelDoesNotReachTheNextStatement(t *testing.T) {
	// When PostgreSQL does not acknowledge a revocation's CancelRequest in
	// time (pgx reports no error then), the cancel may still arrive later:
	// the connection it targets must not serve anyone again.
	cluster := &fakecluster.Revoker{}
	staller := &cancelStaller{}
	pcfg := pgxConfig(t, sharedPG, 1)
	pcfg.ConnConfig.DialFunc = staller.dial
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}}, Cluster: cluster})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	admin := rawPool(t, sharedPG, 2)

	c, err := p.Acquire(as("a"))
	if err != nil {
		t.Fatal(err)
	}
	var revokedPID int
	if err := c.QueryRow(as("a"), "select pg_backend_pid()").Scan(&revokedPID); err != nil {
		t.Fatal(err)
	}
	staller.mu.Lock()
	staller.stalling = true
	staller.mu.Unlock()
	revokeAndRelease(t, cluster, c, nil) // waits for the CancelRequest to give up

	// The tenant's next statement waits on a lock the test holds, while the
	// held-back cancel reaches the server.
	lock, err := admin.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	if _, err := lock.Exec(context.Background(), "select pg_advisory_lock(31031)"); err != nil {
		t.Fatal(err)
	}
	type result struct {
		pid int
		err error
	}
	next := make(chan result, 1)
	go func() {
		var r result
		r.err = p.QueryRow(as("a"), "select pg_backend_pid() from (select pg_advisory_lock(31031)) l").Scan(&r.pid)
		next <- r
	}()
	eventually(t, "the next statement waits for the lock", func() bool {
		var n int
		err := admin.QueryRow(context.Background(),
			"select count(*) from pg_stat_activity where wait_event_type = 'Lock' and query like '%pg_advisory_lock(31031)) l'").Scan(&n)
		return err == nil && n == 1
	})
	if n := staller.forward(t); n != 1 {
		t.Fatalf("%d CancelRequests were held back, want 1", n)
	}
	if _, err := lock.Exec(context.Background(), "select pg_advisory_unlock(31031)"); err != nil {
		t.Fatal(err)
	}
	r := <-next
	if r.err != nil {
		if isQueryCanceled(r.err) {
			t.Fatalf("the revocation's late cancel reached the next statement (backend %d, revoked on %d): %v", r.pid, revokedPID, r.err)
		}
		t.Fatal(r.err)
	}
	if _, err := lock.Exec(context.Background(), "select pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
	assertNothingHeld(t, p)
}
