package otelsetup_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// TestMain fails the run when a test leaves a goroutine behind: an exporter
// or provider that Shutdown did not stop.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := tenantdbtest.FindLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}
