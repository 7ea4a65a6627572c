package otelsetup_test

import (
	"testing"

	"github.com/tenantdb/tenantdb/internal/integration/testmain"
)

// TestMain fails the run when a test leaves a goroutine behind: an exporter
// or provider that Shutdown did not stop.
func TestMain(m *testing.M) { testmain.Exit(m.Run(), nil) }
