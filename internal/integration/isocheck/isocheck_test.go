package main

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestIsolationChecker runs the checker briefly over every configuration (and
// 4 s more over each of longerConfigs), as CI does on every change: once with
// a fixed seed and once with a fresh one,
// whose seed it prints so that a failure can be run again with
// go run ./internal/integration/isocheck -seed N. Any violation fails it.
func TestIsolationChecker(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, PgBouncer and Redis")
	}
	ctx := context.Background()
	e, err := startEnv(ctx, true, true, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	for _, seed := range []uint64{1, rand.Uint64()} {
		t.Logf("seed %d", seed)
		tot, err := checkOn(ctx, e, options{
			duration: 12 * time.Second, seed: seed, config: "all", faults: true, shrink: 10 * time.Second,
		}, logWriter{t})
		if err != nil {
			t.Fatal(err)
		}
		if tot.ops == 0 || tot.hostiles == 0 {
			t.Errorf("seed %d ran %d operations, %d hostile statements", seed, tot.ops, tot.hostiles)
		}
		if tot.violations > 0 {
			t.Errorf("seed %d: %d violations (see the log; go run ./internal/integration/isocheck -seed %d)", seed, tot.violations, seed)
		}
		// The replica and the time limits need seconds, not the half second
		// each configuration gets above, for a cut-off or a hold's end.
		for _, name := range longerConfigs {
			tot, err := checkOn(ctx, e, options{
				duration: 4 * time.Second, seed: seed, config: name, faults: true, shrink: 10 * time.Second,
			}, logWriter{t})
			if err != nil {
				t.Fatal(err)
			}
			if tot.violations > 0 {
				t.Errorf("%s, seed %d: %d violations (go run ./internal/integration/isocheck -config %s -seed %d)", name, seed, tot.violations, name, seed)
			}
		}
	}
}

// longerConfigs get 4 s more each in TestIsolationChecker.
var longerConfigs = []string{"replicas", "replicas-tx", "replicas-timelimits", "timelimits", "timelimits-tx"}

// logWriter writes the checker's report to the test's log, line by line.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
