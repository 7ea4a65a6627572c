package tenantdbtest

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// TestPrometheusRetriesATakenPort hands Prometheus, as its first free port,
// one that a listener of this process holds, as when another process takes
// the port between the pick and Prometheus' bind: Prometheus must exit on
// it and be started again on another port, which it serves.
//
// Not parallel: it replaces pickHostPort, which the parallel tests use after
// the sequential ones have finished.
func TestPrometheusRetriesATakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	var picked []int
	pickHostPort = func(ip netip.Addr) (int, error) {
		port := takenPort
		if len(picked) > 0 {
			var err error
			if port, err = freePort(ip); err != nil {
				return 0, err
			}
		}
		picked = append(picked, port)
		return port, nil
	}
	t.Cleanup(func() { pickHostPort = freePort })

	p := StartPrometheus(t)
	if len(picked) != 2 || strings.HasSuffix(p.URL, ":"+strconv.Itoa(takenPort)) {
		t.Fatalf("ports picked %v (the first taken), Prometheus at %s; want it on the second", picked, p.URL)
	}
	if s, err := p.Query(context.Background(), "1 + 1"); err != nil || len(s) != 1 || s[0].Value != 2 {
		t.Fatalf("query: %v, %v", s, err)
	}
}
