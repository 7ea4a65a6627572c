package pool

import (
	"context"
	"testing"
	"time"
)

func TestRunnerRequestSentBackByACutKeepsWaiting(t *testing.T) {
	// A Runner's request waits over its tenant's cap whatever the plan's
	// MaxWait, also when it got a tenant slot on arrival and a cut of the
	// tenant's limit sends it back to wait for the cap.
	g, clock := newTestGate(t, Config{Capacity: 2, Plans: map[string]Plan{"p": {MaxConns: 2, MaxWaiting: 1, MaxWait: time.Hour}}})
	a, b := acquire(t, g, "a"), acquire(t, g, "b") // the capacity is taken
	defer b.Release()
	runnerCtx := context.WithValue(context.Background(), runnerKey{}, true)
	done := make(chan error, 1)
	go func() {
		p, err := g.Acquire(runnerCtx, "a")
		p.Release()
		done <- err
	}()
	waitUntil(t, "the Runner's request waits for capacity", func() bool { return g.Stat().Waiting == 1 })
	clock.advance(2 * time.Hour) // past the plan's MaxWait
	woke := make(chan struct{}, 1)
	wakeIgnoredHook = func() { woke <- struct{}{} }
	defer func() { wakeIgnoredHook = nil }()
	if err := g.SetTenantLimit("a", 1); err != nil { // sends the request back to a's cap queue
		t.Fatal(err)
	}
	// The request has seen the cut once it wakes; once it wakes to a second
	// signal, it has gone on waiting after the cut.
	for range 2 {
		select {
		case err := <-done:
			t.Fatalf("sent back by the cut, the Runner's request ended: %v", err)
		case <-woke:
		case <-time.After(10 * time.Second):
			t.Fatal("the wake was never seen")
		}
		g.mu.Lock()
		if w := g.tenants["a"].wait.lanes[0].capQ.head; w != nil {
			w.v.signal()
		}
		g.mu.Unlock()
	}
	a.Release() // a's slot frees: the request takes it
	if err := recvErr(t, done); err != nil {
		t.Fatal(err)
	}
}
