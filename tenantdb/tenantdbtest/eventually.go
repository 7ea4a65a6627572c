package tenantdbtest

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Eventually calls cond until it returns true, and fails t, saying what was
// awaited, if timeout passes first. It polls every millisecond: tests use it
// to synchronise on in-process state (a tenant's waiter queued, a connection
// returned) instead of sleeping. The timeout only matters when the test
// fails; make it long enough for a loaded machine.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	poll(t, timeout, time.Millisecond, time.Millisecond, what, func(context.Context) error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

// EventuallyNoError calls f until it returns nil, and fails t with what was
// awaited and f's last error if timeout passes first. Each call gets a
// context that ends after at most five seconds, so one hung call does not
// use up the timeout; calls start 25 ms apart and back off to 250 ms. Tests
// use it to wait for an external server (a restarted container, spans
// indexed by Jaeger, a rule evaluated by Prometheus).
func EventuallyNoError(t testing.TB, timeout time.Duration, what string, f func(ctx context.Context) error) {
	t.Helper()
	poll(t, timeout, 25*time.Millisecond, 250*time.Millisecond, what, f)
}

// maxTry bounds one call of EventuallyNoError's f.
const maxTry = 5 * time.Second

// errNotYet is what Eventually's cond returning false stands for.
var errNotYet = errors.New("not yet")

// poll calls f until it returns nil or timeout passes, sleeping every
// between calls, doubled after each call up to slowest.
func poll(t testing.TB, timeout, every, slowest time.Duration, what string, f func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), maxTry)
		err := f(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			if errors.Is(err, errNotYet) {
				t.Fatalf("timed out after %v waiting until %s", timeout, what)
			} else {
				t.Fatalf("timed out after %v waiting until %s: %v", timeout, what, err)
			}
			return // for a TB whose Fatalf returns
		}
		time.Sleep(every)
		every = min(2*every, slowest)
	}
}
