package tenantdbtest

import (
	"runtime"
	"testing"
	"time"
)

// TestStallProbeSeesAProcessThatCannotRun: with one P held by a loop that
// the runtime must preempt (as a process the machine does not run), the
// probe wakes late and says so.
func TestStallProbeSeesAProcessThatCannotRun(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	start := time.Now()
	p := StartStallProbe()
	time.Sleep(5 * time.Millisecond) // let the probe start its sleep: the scenario, not synchronisation
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
	}
	share := p.Share()
	if w := p.Stop(); w < 5*time.Millisecond || share < 0.05 {
		t.Fatalf("the only P was held for 100ms of %v, and the probe woke at most %v late, %.0f%% of the time in all",
			time.Since(start).Round(time.Millisecond), w, 100*share)
	}
}
