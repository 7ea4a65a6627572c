package pool

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestMain fails the package's tests when goroutines they started outlive
// them (a waiter's timer, a Runner's worker, a lease watcher), as
// go.uber.org/goleak's VerifyTestMain would, with the standard library
// only: a test dependency of this module would enter the build list of
// every module that requires it.
func TestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		if leaked := leakedGoroutines(before, 10*time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines outlived the tests:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// leakedGoroutines waits up to wait for the goroutines beyond the first
// before to end (goroutines end a moment after whatever released them), and
// returns every goroutine's stack if some are still running then, or "".
func leakedGoroutines(before int, wait time.Duration) string {
	deadline := time.Now().Add(wait)
	for delay := time.Millisecond; runtime.NumGoroutine() > before; delay = min(2*delay, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			return string(buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(delay) // a poll of NumGoroutine, as goleak retries
	}
	return ""
}
