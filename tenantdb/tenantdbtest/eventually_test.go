package tenantdbtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// fatalRecorder is a testing.TB whose Fatalf records the failure and
// returns, so that a test can check how a helper fails.
type fatalRecorder struct {
	testing.TB
	failure string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.failure = fmt.Sprintf(format, args...)
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	r := &fatalRecorder{TB: t}
	calls := 0
	tenantdbtest.Eventually(r, time.Minute, "the third call", func() bool { calls++; return calls == 3 })
	if r.failure != "" || calls != 3 {
		t.Errorf("failure %q after %d calls, want none after 3", r.failure, calls)
	}
}

func TestEventuallyFailsNamingWhatItAwaited(t *testing.T) {
	r := &fatalRecorder{TB: t}
	tenantdbtest.Eventually(r, 20*time.Millisecond, "pigs fly", func() bool { return false })
	if want := "timed out after 20ms waiting until pigs fly"; r.failure != want {
		t.Errorf("failure %q, want %q", r.failure, want)
	}
}

// TestEventuallyNoErrorBoundsEachTry: each call gets a context with a
// deadline within the timeout's reach, and the failure carries the last
// error.
func TestEventuallyNoErrorBoundsEachTry(t *testing.T) {
	r := &fatalRecorder{TB: t}
	calls := 0
	tenantdbtest.EventuallyNoError(r, 200*time.Millisecond, "the server answers", func(ctx context.Context) error {
		calls++
		d, ok := ctx.Deadline()
		if !ok || time.Until(d) > 5*time.Second {
			t.Errorf("call %d: deadline %v, %v; want one within 5 s", calls, d, ok)
		}
		return fmt.Errorf("refused %d", calls)
	})
	if calls < 2 || !strings.HasPrefix(r.failure, "timed out after 200ms waiting until the server answers: refused ") ||
		!strings.HasSuffix(r.failure, fmt.Sprint(calls)) {
		t.Errorf("failure %q after %d calls, want the last call's error", r.failure, calls)
	}

	r = &fatalRecorder{TB: t}
	calls = 0
	tenantdbtest.EventuallyNoError(r, time.Minute, "the second call", func(ctx context.Context) error {
		if calls++; calls < 2 {
			return errors.New("not yet")
		}
		return nil
	})
	if r.failure != "" || calls != 2 {
		t.Errorf("failure %q after %d calls, want none after 2", r.failure, calls)
	}
}
