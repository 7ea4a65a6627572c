// Package poll waits in tests until a condition holds, polling instead of
// sleeping, so that a test synchronises on state rather than on time.
package poll

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Until calls cond every interval until it returns true, and fails t,
// saying what was awaited, if timeout passes first. The timeout matters
// only when the test fails.
func Until(t testing.TB, timeout, every time.Duration, what string, cond func() bool) {
	t.Helper()
	NoError(t, timeout, every, every, what, func(context.Context) error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

// NoError calls f until it returns nil, and fails t with what was awaited
// and f's last error if timeout passes first. It sleeps every between calls,
// doubled after each call up to slowest. Each call gets a context that ends
// after at most MaxTry, so that one hung call does not use up the timeout.
func NoError(t testing.TB, timeout, every, slowest time.Duration, what string, f func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), MaxTry)
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

// MaxTry bounds one call of NoError's f.
const MaxTry = 5 * time.Second

// errNotYet is what Until's cond returning false stands for.
var errNotYet = errors.New("not yet")
