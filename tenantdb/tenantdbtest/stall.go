package tenantdbtest

import (
	"sync/atomic"
	"time"
)

// A timing can only be judged while the process could run: with the machine
// starved (other jobs on every core), a renewal that comes too late or a
// latency that grows says more about the machine than about the code.
// StallProbe tells such a trial apart, so that a test stays strict on a
// machine that is not starved.

// stallTick is how long the probe sleeps between two readings of the clock.
const stallTick = 10 * time.Millisecond

// StallProbe measures how late this process wakes from a short sleep, which
// grows when the operating system does not run it (other processes on every
// core) or its own goroutines crowd the Go scheduler; on an idle machine it
// is well under a millisecond.
type StallProbe struct {
	worst, late atomic.Int64 // ns: the latest wake, and all wakes' lateness together
	start       time.Time
	stop        chan struct{}
	done        chan struct{}
}

// StartStallProbe starts a probe; Stop ends it.
func StartStallProbe() *StallProbe {
	p := &StallProbe{start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTimer(stallTick)
		defer t.Stop()
		for asleep := time.Now(); ; asleep = time.Now() {
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
			late := max(0, time.Since(asleep)-stallTick)
			p.late.Add(int64(late))
			if late > time.Duration(p.worst.Load()) {
				p.worst.Store(int64(late))
			}
			t.Reset(stallTick)
		}
	}()
	return p
}

// Worst is the latest the probe woke since it started: one long stall.
func (p *StallProbe) Worst() time.Duration { return time.Duration(p.worst.Load()) }

// Share is the part of the time since the probe started that its wakes were
// late by, together: how much of it the process could not run. One stall
// (a collection, a preemption) moves it little; a machine that runs the
// process only now and then, much.
func (p *StallProbe) Share() float64 {
	return float64(p.late.Load()) / float64(max(1, time.Since(p.start)))
}

// Stop ends the probe and returns Worst.
func (p *StallProbe) Stop() time.Duration {
	close(p.stop)
	<-p.done
	return p.Worst()
}
