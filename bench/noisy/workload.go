package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// workload is the noisy-neighbour experiment at a time scale: the noisy
// tenant's queries all arrive at once, the quiet tenant's are spread evenly.
type workload struct {
	noisyN, quietN          int
	noisySleep, quietSleep  time.Duration
	quietSpread, quietStart time.Duration
}

func newWorkload(scale float64) workload {
	s := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }
	return workload{
		noisyN: 200, quietN: 50,
		noisySleep: s(time.Second), quietSleep: s(20 * time.Millisecond),
		quietSpread: s(time.Second), quietStart: s(50 * time.Millisecond),
	}
}

// queryFunc runs one query that sleeps for d on the server, as tenant.
type queryFunc func(ctx context.Context, tenant string, d time.Duration) error

// sleepSQL is the query every scenario runs; the comment lets a sampler on
// pg_stat_activity tell the tenants apart.
func sleepSQL(tenant string, d time.Duration) string {
	return fmt.Sprintf("select pg_sleep(%.6f) /* tenant=%s */", d.Seconds(), tenant)
}

// outcome is what one tenant saw in one run.
type outcome struct {
	latencies []time.Duration // of completed requests
	ends      []time.Duration // when each of latencies completed, from the start of the run
	rejects   []time.Duration // how long each over-limit rejection took
	errors    int             // any other failure
	makespan  time.Duration   // from the start of the run to its last answer
	firstErr  error
}

func (o *outcome) record(d time.Duration, err error, since time.Duration) {
	switch {
	case err == nil:
		o.latencies = append(o.latencies, d)
		o.ends = append(o.ends, since)
	case errors.Is(err, tenantdb.ErrOverLimit):
		o.rejects = append(o.rejects, d)
	default:
		o.errors++
		if o.firstErr == nil {
			o.firstErr = err
		}
	}
	o.makespan = max(o.makespan, since)
}

// quietAlone runs only the quiet tenant's schedule: its unloaded latency,
// measured on the same pool just before the flood.
func (w workload) quietAlone(ctx context.Context, q queryFunc) *outcome {
	var quiet outcome
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	w.spreadQuiet(ctx, &wg, start, func() {
		t0 := time.Now()
		err := q(ctx, "quiet", w.quietSleep)
		mu.Lock()
		quiet.record(time.Since(t0), err, time.Since(start))
		mu.Unlock()
	})
	wg.Wait()
	return &quiet
}

// flood runs both tenants at once and reports progress every few seconds
// while it runs.
func (w workload) flood(ctx context.Context, name string, q queryFunc) (noisy, quiet *outcome) {
	noisy, quiet = &outcome{}, &outcome{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var noisyDone, quietDone atomic.Int64
	start := time.Now()
	for range w.noisyN {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			err := q(ctx, "noisy", w.noisySleep)
			mu.Lock()
			noisy.record(time.Since(t0), err, time.Since(start))
			mu.Unlock()
			noisyDone.Add(1)
		}()
	}
	w.spreadQuiet(ctx, &wg, start.Add(w.quietStart), func() {
		t0 := time.Now()
		err := q(ctx, "quiet", w.quietSleep)
		mu.Lock()
		quiet.record(time.Since(t0), err, time.Since(start))
		mu.Unlock()
		quietDone.Add(1)
	})
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return noisy, quiet
		case <-tick.C:
			progress("%s: %5.1fs  noisy %d/%d answered, quiet %d/%d",
				name, time.Since(start).Seconds(), noisyDone.Load(), w.noisyN, quietDone.Load(), w.quietN)
		}
	}
}

// spreadQuiet starts the quiet tenant's requests evenly over quietSpread
// from start, each in its own goroutine.
func (w workload) spreadQuiet(ctx context.Context, wg *sync.WaitGroup, start time.Time, do func()) {
	gap := w.quietSpread / time.Duration(w.quietN)
	for i := range w.quietN {
		at := start.Add(time.Duration(i) * gap)
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return
			}
		}
		wg.Add(1)
		go func() { defer wg.Done(); do() }()
	}
}

// result is one row of the report.
type result struct {
	Scenario  string  `json:"scenario"`
	Tenant    string  `json:"tenant"`
	P50       float64 `json:"p50_ms"`
	P99       float64 `json:"p99_ms"`
	Max       float64 `json:"max_ms"`
	Completed int     `json:"completed"`
	Rejected  int     `json:"rejected"`
	Makespan  float64 `json:"makespan_ms"`
	MaxReject float64 `json:"max_reject_ms,omitempty"`
	// MaxRejectServer is the slowest rejection as the server measured it
	// (the http-* scenarios): from the request's arrival in the handler
	// chain to the written 429.
	MaxRejectServer float64 `json:"max_reject_server_ms,omitempty"`
	P99RejectServer float64 `json:"p99_reject_server_ms,omitempty"`
	Errors          int     `json:"errors,omitempty"`
	FirstError      string  `json:"first_error,omitempty"`
	// Oracle is set on the oracle-* scenarios' rows, one per limit
	// (Tenant names it): P50 and P99 are then the quiet tenant's, Makespan
	// the noisy load's, all medians over rounds.
	Oracle *oracleStats `json:"oracle,omitempty"`
	// BatchShare is the mean share of the shared pool the batch class held
	// while some of its requests waited, MostBatch the most it held (the
	// class-* scenarios' noisy rows).
	BatchShare float64 `json:"batch_share,omitempty"`
	MostBatch  int     `json:"most_batch,omitempty"`
}

func (o *outcome) result(scenario, tenant string) result {
	r := result{Scenario: scenario, Tenant: tenant, Completed: len(o.latencies), Rejected: len(o.rejects),
		Makespan: ms(o.makespan), Errors: o.errors}
	if len(o.latencies) > 0 {
		r.P50, r.P99, r.Max = ms(percentile(o.latencies, 50)), ms(percentile(o.latencies, 99)), ms(slices.Max(o.latencies))
	}
	if len(o.rejects) > 0 {
		r.MaxReject = ms(slices.Max(o.rejects))
	}
	if o.firstErr != nil {
		r.FirstError = o.firstErr.Error()
	}
	return r
}

// percentile is the nearest-rank percentile p of ds.
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(i, len(s))-1)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
