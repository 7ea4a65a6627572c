package otelsetup

import "testing"

// TestClearTextByDefault: without OTLPConfig.Insecure, a URL's scheme
// decides TLS, and host:port goes in clear text only to loopback.
func TestClearTextByDefault(t *testing.T) {
	for _, c := range []struct {
		endpoint string
		want     bool
		err      bool
	}{
		{"localhost:4317", true, false},
		{"127.0.0.1:4318", true, false},
		{"[::1]:4317", true, false},
		{"jaeger:4317", false, false},
		{"10.0.0.5:4317", false, false},
		{"http://jaeger:4318", true, false},
		{"https://localhost:4318", false, false},
		{"jaeger", false, true},
	} {
		got, err := clearTextByDefault(c.endpoint, len(c.endpoint) > 4 && (c.endpoint[:4] == "http"))
		if got != c.want || (err != nil) != c.err {
			t.Errorf("clearTextByDefault(%q) = %v, %v; want %v, error %v", c.endpoint, got, err, c.want, c.err)
		}
	}
}
