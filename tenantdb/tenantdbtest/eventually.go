package tenantdbtest

import (
	"context"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/internal/poll"
)

// Eventually calls cond until it returns true, and fails t, saying what was
// awaited, if timeout passes first. It polls every millisecond: tests use it
// to synchronise on in-process state (a tenant's waiter queued, a connection
// returned) instead of sleeping. The timeout only matters when the test
// fails; make it long enough for a loaded machine.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, timeout, time.Millisecond, what, cond)
}

// EventuallyNoError calls f until it returns nil, and fails t with what was
// awaited and f's last error if timeout passes first. Each call gets a
// context that ends after at most five seconds, so one hung call does not
// use up the timeout; calls start 25 ms apart and back off to 250 ms. Tests
// use it to wait for an external server (a restarted container, spans
// indexed by Jaeger, a rule evaluated by Prometheus).
func EventuallyNoError(t testing.TB, timeout time.Duration, what string, f func(ctx context.Context) error) {
	t.Helper()
	poll.NoError(t, timeout, 25*time.Millisecond, 250*time.Millisecond, what, f)
}
