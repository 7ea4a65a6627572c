package pool_test

import (
	"context"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/internal/poll"
	"github.com/tenantdb/tenantdb/pool"
)

func mustNew(t testing.TB, cfg pool.Config) *pool.Gate {
	t.Helper()
	g, err := pool.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(g.Close)
	return g
}

func mustAcquire(t testing.TB, g *pool.Gate, id string) pool.Permit {
	t.Helper()
	p, err := g.Acquire(context.Background(), id)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", id, err)
	}
	return p
}

type result struct {
	p   pool.Permit
	err error
}

// acquireAsync starts an Acquire and returns where its result will arrive.
func acquireAsync(ctx context.Context, g *pool.Gate, id string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		p, err := g.Acquire(ctx, id)
		ch <- result{p, err}
	}()
	return ch
}

// eventually polls a probe of the Gate's state every 100 µs until it holds,
// for at most ten seconds.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, 100*time.Microsecond, what, cond)
}

func waitingIs(g *pool.Gate, n int) func() bool {
	return func() bool { return g.Stat().Waiting == n }
}

func tenantWaitingIs(g *pool.Gate, id string, n int) func() bool {
	return func() bool { s, _ := g.TenantStat(id); return s.Waiting == n }
}

// recv returns the result from ch, failing the test if none comes soon.
func recv(t testing.TB, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no result within 10s")
		return result{}
	}
}

// assertPending fails the test if the request behind ch was granted or
// failed. It asks the Gate, which counts a grant under its lock the moment it
// is made, rather than only ch, which the waiter's goroutine fills later.
func assertPending(t testing.TB, ch <-chan result, g *pool.Gate, id string, waiting int) {
	t.Helper()
	if s, _ := g.TenantStat(id); s.Waiting != waiting {
		t.Fatalf("expected %d of %s's requests to wait, the Gate has %d", waiting, id, s.Waiting)
	}
	select {
	case r := <-ch:
		t.Fatalf("expected the request to wait, got permit=%v err=%v", r.p != (pool.Permit{}), r.err)
	default:
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// assertDrained checks that nothing is in use or waiting.
func assertDrained(t testing.TB, g *pool.Gate) {
	t.Helper()
	if s := g.Stat(); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("gate not drained: %d in use, %d waiting", s.InUse, s.Waiting)
	}
}
