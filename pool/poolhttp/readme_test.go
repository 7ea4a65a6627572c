package poolhttp_test

import (
	"testing"

	"github.com/tenantdb/tenantdb/internal/readmetest"
)

// TestReadmeHTTP builds the README's poolhttp examples as the complete
// programs they claim to be.
func TestReadmeHTTP(t *testing.T) {
	for _, heading := range []string{
		"### Incoming HTTP requests: `poolhttp.Middleware`",
		"### Outbound HTTP calls: `poolhttp.Transport`",
	} {
		t.Run(heading, func(t *testing.T) { readmetest.Build(t, readmetest.Program(t, heading)) })
	}
}
