package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool/redislimit"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// tcpProxy forwards connections to a target until cut: then it drops the
// upstream side and leaves the client side open and silent, as a network
// partition does (the client's reads hang rather than fail).
type tcpProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool       // guarded by mu
	conns []net.Conn // guarded by mu: every connection, both sides
	ups   []net.Conn // guarded by mu: the upstream sides
	wg    sync.WaitGroup
}

func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		cut := p.cut
		p.mu.Unlock()
		if cut {
			p.wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, u)
		p.ups = append(p.ups, u)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(c, u) })
		p.wg.Go(func() {
			_, _ = io.Copy(u, c)
			_, _ = io.Copy(io.Discard, c) // after a cut: swallow, answer nothing
		})
	}
}

// partition cuts every connection from the target; new ones hang too.
func (p *tcpProxy) partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for _, u := range p.ups {
		_ = u.Close()
	}
}

// partitionRun is one scenario: process "cut" holds the tenant's whole
// cluster cap with long queries, then loses Redis (cut); two other
// processes flood the tenant. It returns the peak of the tenant's active
// backends across the three processes, and the cut process's query errors.
type partitionRun struct {
	peak     int
	cutErrs  []error
	cutStats redislimit.Stats
}

const (
	partitionCap = 4
	partitionTTL = time.Second
)

// holdLock holds a session advisory lock on a connection of its own (no
// pool's), so that queries waiting for it (pg_advisory_xact_lock_shared) stay
// active in PostgreSQL until the test has seen what it waits for: their
// length is what the test observes, not a guess of how long a busy machine
// needs. unlock is idempotent.
func holdLock(t *testing.T, key int64) (unlock func()) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), "select pg_advisory_lock($1)", key); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unlock = func() { once.Do(func() { _ = conn.Close(context.Background()) }) } // ending the session frees the lock
	t.Cleanup(unlock)
	return unlock
}

func runPartition(t *testing.T, mode redislimit.Mode, redisAddr string, cutAddr string, cut func(), firstPath int) partitionRun {
	tag := clusterTag()
	prefix := "partition-" + tag
	newSide := func(addr string) (*redislimit.Limiter, *tenantdb.Pool) {
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		lim, err := redislimit.New(redislimit.Config{Client: rdb, Prefix: prefix, Mode: mode, LeaseTTL: partitionTTL,
			OpTimeout: 200 * time.Millisecond, RecheckEvery: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(lim.Close)
		p := newPool(t, sharedPG, clusterMaxConns, tenantdb.Config{
			Plans: map[string]tenantdb.Plan{"p": {MaxConns: partitionCap, MaxWaiting: tenantdb.Unbounded}}, Cluster: lim})
		return lim, p
	}
	cutLim, cutPool := newSide(cutAddr)
	_, p1 := newSide(redisAddr)
	_, p2 := newSide(redisAddr)

	sampler := startActivitySampler(t, tag)
	// The cut process's queries last until the test unlocks: FailClosed must
	// revoke them before, FailOpen lets them run on while the others take the cap.
	key := time.Now().UnixNano()
	unlock := holdLock(t, key)
	holdSQL := fmt.Sprintf("select pg_advisory_xact_lock_shared(%d) /* partition tag=%s */", key, tag)
	errs := make(chan error, partitionCap)
	// Each of the cap's queries through another path (from firstPath on),
	// all of which the revocation must stop.
	paths := []func() error{
		func() error { _, err := cutPool.Exec(as("acme"), holdSQL); return err },
		func() error {
			rows, err := cutPool.Query(as("acme"), holdSQL)
			if err != nil {
				return err
			}
			for rows.Next() {
			}
			rows.Close()
			return rows.Err()
		},
		func() error { var v any; return cutPool.QueryRow(as("acme"), holdSQL).Scan(&v) },
		func() error {
			b := &pgx.Batch{}
			b.Queue(holdSQL)
			return cutPool.SendBatch(as("acme"), b).Close()
		},
		func() error {
			tx, err := cutPool.Begin(as("acme"))
			if err != nil {
				return err
			}
			defer tx.Rollback(context.Background())
			_, err = tx.Exec(context.Background(), holdSQL)
			return err
		},
	}
	for i := range partitionCap {
		go func() { errs <- paths[(firstPath+i)%len(paths)]() }()
	}
	eventually(t, "the cut process holds the cap", func() bool {
		return cutLim.Stats().Held == partitionCap && sampler.current() == partitionCap
	})
	cut()

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var served atomic.Int64
	floodSQL := "select pg_sleep(0.05) /* partition tag=" + tag + " */"
	for _, p := range []*tenantdb.Pool{p1, p2} {
		for range 2 * partitionCap {
			wg.Go(func() {
				for ctx.Err() == nil {
					qctx, cancel := context.WithTimeout(tenantdb.WithTenant(ctx, "acme"), 30*time.Second)
					_, err := p.Exec(qctx, floodSQL)
					switch {
					case err == nil:
						served.Add(1)
					case errors.Is(err, redislimit.ErrUnavailable):
						time.Sleep(time.Millisecond) // a client backing off
					case ctx.Err() == nil:
						t.Errorf("flood: %v", err)
					}
					cancel()
				}
			})
		}
	}
	if mode == redislimit.FailOpen {
		// Redis expires the cut process's leases and the others take the cap
		// while its queries run on: twice the cap at once.
		eventually(t, "the others take the cap beside the cut process's queries", func() bool {
			return sampler.peak() >= 2*partitionCap
		})
		unlock()
	}
	var run partitionRun
	for range partitionCap {
		select {
		case err := <-errs:
			run.cutErrs = append(run.cutErrs, err)
		case <-time.After(time.Minute):
			t.Fatal("the cut process's queries did not end")
		}
	}
	unlock()
	// The others take the slots once Redis expires the cut process's
	// leases; flood a while longer to see them hold the cap.
	n := served.Load()
	eventually(t, "the others serve", func() bool { return served.Load() >= n+20 })
	stop()
	wg.Wait()
	run.peak = sampler.stop()
	run.cutStats = cutLim.Stats()
	t.Logf("%s: peak %d active backends of cap %d (excess %d); others served %d; cut process: %v; limiter %+v",
		mode, run.peak, partitionCap, max(0, run.peak-partitionCap), served.Load(), run.cutErrs, run.cutStats)
	return run
}

// TestPartitionOneProcessCutOffFromRedis cuts one process (of three) off
// from Redis behind a TCP proxy while it holds its tenant's whole cluster
// cap; the other two stay connected and flood the tenant. Redis expires the
// cut process's leases after the TTL and hands the slots to the others.
// FailClosed: the cut process revokes its leases before Redis can expire
// them and cancels their queries, so PostgreSQL never runs more of the
// tenant's queries than the cap (excess 0). FailOpen: its queries run on, so
// the tenant holds up to twice its cap (excess = the cap) until they end.
func TestPartitionOneProcessCutOffFromRedis(t *testing.T) {
	r := tenantdbtest.StartRedis(t)
	t.Run("fail-closed", func(t *testing.T) {
		proxy := startProxy(t, r.Addr)
		run := runPartition(t, redislimit.FailClosed, r.Addr, proxy.Addr(), proxy.partition, 0)
		if run.peak > partitionCap {
			t.Errorf("peak active backends %d, cap %d: excess %d, want 0", run.peak, partitionCap, run.peak-partitionCap)
		}
		for _, err := range run.cutErrs {
			if !errors.Is(err, tenantdb.ErrRevoked) {
				t.Errorf("the cut process's query: err = %v, want ErrRevoked", err)
			}
		}
		if run.cutStats.RevokedLeases != partitionCap {
			t.Errorf("cut process revoked %d leases, want %d", run.cutStats.RevokedLeases, partitionCap)
		}
	})
	t.Run("fail-open", func(t *testing.T) {
		proxy := startProxy(t, r.Addr)
		run := runPartition(t, redislimit.FailOpen, r.Addr, proxy.Addr(), proxy.partition, 0)
		if run.peak != 2*partitionCap {
			t.Errorf("peak active backends %d, want %d: the cut process's queries run on, the others take the cap", run.peak, 2*partitionCap)
		}
		for _, err := range run.cutErrs {
			if err != nil {
				t.Errorf("the cut process's query failed: %v", err)
			}
		}
	})
}

// TestPartitionRedisPausedPastTTL pauses Redis (every process's calls hang)
// for longer than the lease TTL while one process holds the cap. FailClosed:
// its leases are revoked on time although Redis never answers, and their
// queries cancelled; nobody gets a slot while Redis is paused, and the other
// processes take the slots once it resumes: excess 0.
func TestPartitionRedisPausedPastTTL(t *testing.T) {
	r := tenantdbtest.StartRedis(t)
	var paused atomic.Bool
	t.Cleanup(func() {
		if paused.Load() {
			_ = r.Unpause(context.Background())
		}
	})
	run := runPartition(t, redislimit.FailClosed, r.Addr, r.Addr, func() {
		if err := r.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		paused.Store(true)
		go func() {
			time.Sleep(3 * partitionTTL) // the scenario: paused past the TTL
			if err := r.Unpause(context.Background()); err != nil {
				t.Error(err)
			}
			paused.Store(false)
		}()
	}, 1)
	if run.peak > partitionCap {
		t.Errorf("peak active backends %d, cap %d: excess %d, want 0", run.peak, partitionCap, run.peak-partitionCap)
	}
	for _, err := range run.cutErrs {
		if !errors.Is(err, tenantdb.ErrRevoked) {
			t.Errorf("the holder's query: err = %v, want ErrRevoked", err)
		}
	}
}
