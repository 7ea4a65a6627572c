package redislimit

import (
	"runtime/metrics"
	"time"
)

// A lease's timing can only be judged while this process and Redis could
// run: with the machine starved (other jobs on every core), a renewal that
// comes too late, and the revocation that follows, is the limiter doing
// what it must when it cannot prove it holds a lease. stallProbe tells such
// a trial apart by what the Go scheduler saw, so that the tests stay strict
// on a machine that is not starved.

// schedLatencies is the runtime metric of how long goroutines waited to run.
const schedLatencies = "/sched/latencies:seconds"

// stallProbe is a reading of schedLatencies to compare a later one with.
type stallProbe struct{ counts []uint64 }

func startStallProbe() stallProbe {
	s := []metrics.Sample{{Name: schedLatencies}}
	metrics.Read(s)
	return stallProbe{counts: append([]uint64(nil), s[0].Value.Float64Histogram().Counts...)}
}

// worst is the lower bound of the longest wait to run that a goroutine of
// this process had since p was read: never more than it was.
func (p stallProbe) worst() time.Duration {
	s := []metrics.Sample{{Name: schedLatencies}}
	metrics.Read(s)
	h := s[0].Value.Float64Histogram()
	for i := len(h.Counts) - 1; i >= 0; i-- {
		if i < len(p.counts) && h.Counts[i] > p.counts[i] && h.Buckets[i] > 0 {
			return time.Duration(h.Buckets[i] * float64(time.Second))
		}
	}
	return 0
}
