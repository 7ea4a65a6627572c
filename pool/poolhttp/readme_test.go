package poolhttp_test

import (
	"testing"

	"github.com/tenantdb/tenantdb/internal/doctest"
)

// TestReadmeHTTP builds the documented poolhttp examples as the complete
// programs they claim to be.
func TestReadmeHTTP(t *testing.T) {
	for _, heading := range []string{
		"### Incoming HTTP requests: `poolhttp.Middleware`",
		"### Outbound HTTP calls: `poolhttp.Transport`",
	} {
		t.Run(heading, func(t *testing.T) { doctest.BuildProgram(t, heading, "pool/poolhttp/internal/readme") })
	}
}
