package pool_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

// errLog collects what a Runner reports to OnError.
type errLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errLog) add(_ string, err error) { l.mu.Lock(); l.errs = append(l.errs, err); l.mu.Unlock() }
func (l *errLog) all() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

func newRunner(t testing.TB, cfg pool.RunnerConfig) (*pool.Runner, *errLog) {
	t.Helper()
	log := &errLog{}
	if cfg.OnError == nil {
		cfg.OnError = log.add
	}
	r, err := pool.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		r.Close(ctx)
	})
	return r, log
}

func mustSubmit(t testing.TB, r *pool.Runner, ctx context.Context, tenant string, job pool.Job) {
	t.Helper()
	if err := r.Submit(ctx, tenant, job); err != nil {
		t.Fatalf("Submit(%q): %v", tenant, err)
	}
}

func drain(t testing.TB, r *pool.Runner) {
	t.Helper()
	if dropped, err := r.Close(context.Background()); dropped != 0 || err != nil {
		t.Fatalf("Close: dropped %d, %v", dropped, err)
	}
}

type submitKey struct{}

// TestRunnerJobContext: a job runs with its tenant in the context (the
// module's one key) and the submitter's values, in submission order per
// tenant.
func TestRunnerJobContext(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 1})
	r, _ := newRunner(t, pool.RunnerConfig{Gate: g})
	var mu sync.Mutex
	var seen []string
	for i := range 5 {
		ctx := context.WithValue(context.Background(), submitKey{}, i)
		mustSubmit(t, r, ctx, "acme", func(ctx context.Context) {
			id, _ := pool.TenantFrom(ctx)
			mu.Lock()
			seen = append(seen, id+string(rune('0'+ctx.Value(submitKey{}).(int))))
			mu.Unlock()
		})
	}
	drain(t, r)
	if got := len(seen); got != 5 {
		t.Fatalf("%d jobs ran, want 5", got)
	}
	for i, s := range seen {
		if want := "acme" + string(rune('0'+i)); s != want {
			t.Fatalf("job %d saw %q, want %q (tenant in context, submitter's value, FIFO)", i, s, want)
		}
	}
	assertDrained(t, g)
}

// TestRunnerRefusesPastTheQueue: with the tenant's cap taken and MaxQueued
// jobs queued, Submit returns an *OverLimitError and the job is not
// queued; another tenant's queue is its own; every accepted job runs.
func TestRunnerRefusesPastTheQueue(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 2, Plans: map[string]pool.Plan{"p": {MaxConns: 1}}})
	r, _ := newRunner(t, pool.RunnerConfig{Gate: g, MaxQueued: 3})
	release := make(chan struct{})
	var ran atomic.Int64
	job := func(context.Context) { <-release; ran.Add(1) }
	started := make(chan struct{})
	mustSubmit(t, r, context.Background(), "acme", func(ctx context.Context) { close(started); job(ctx) })
	<-started
	for range 3 {
		mustSubmit(t, r, context.Background(), "acme", job)
	}
	err := r.Submit(context.Background(), "acme", job)
	var ole *pool.OverLimitError
	if !errors.As(err, &ole) || !errors.Is(err, pool.ErrOverLimit) || ole.Tenant != "acme" || ole.Limit != 1 || ole.RetryAfter <= 0 {
		t.Fatalf("past the queue: %v (%+v); want an *OverLimitError for acme, limit 1, a RetryAfter", err, ole)
	}
	if q := r.Queued("acme"); q != 3 {
		t.Fatalf("queued %d, want 3", q)
	}
	mustSubmit(t, r, context.Background(), "globex", job) // its own queue
	close(release)
	drain(t, r)
	if n := ran.Load(); n != 5 {
		t.Fatalf("%d jobs ran, want the 5 accepted", n)
	}
	if err := r.Submit(context.Background(), "acme", job); !errors.Is(err, pool.ErrRunnerClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
}

// TestRunnerBadSubmit: an invalid tenant, an ended context and a nil job are
// refused at Submit.
func TestRunnerBadSubmit(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 1})
	r, _ := newRunner(t, pool.RunnerConfig{Gate: g})
	if err := r.Submit(context.Background(), "", func(context.Context) {}); !errors.Is(err, pool.ErrInvalidTenant) {
		t.Fatalf("empty tenant: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Submit(ctx, "acme", func(context.Context) {}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
	if err := r.Submit(context.Background(), "acme", nil); err == nil {
		t.Fatal("a nil job was accepted")
	}
	if _, err := pool.NewRunner(pool.RunnerConfig{}); !errors.Is(err, pool.ErrInvalidConfig) {
		t.Fatalf("no Gate: %v", err)
	}
}

// TestRunnerCaps: the jobs running never exceed the Gate's capacity (the
// workers) nor a tenant's cap. A tenant alone runs up to its cap (2, with a
// worker free), three tenants together use every worker.
func TestRunnerCaps(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 3, Plans: map[string]pool.Plan{"p": {MaxConns: 2}}})
	r, _ := newRunner(t, pool.RunnerConfig{Gate: g})
	var mu sync.Mutex
	running := map[string]int{}
	peak := map[string]int{}
	total, peakTotal := 0, 0
	hold := make(chan struct{})
	job := func(tenant string) pool.Job {
		return func(context.Context) {
			mu.Lock()
			running[tenant]++
			total++
			peak[tenant] = max(peak[tenant], running[tenant])
			peakTotal = max(peakTotal, total)
			mu.Unlock()
			<-hold
			mu.Lock()
			running[tenant]--
			total--
			mu.Unlock()
		}
	}
	for range 10 {
		mustSubmit(t, r, context.Background(), "solo", job("solo"))
	}
	eventually(t, "solo runs its cap of jobs", func() bool { mu.Lock(); defer mu.Unlock(); return total == 2 })
	for _, tenant := range []string{"a", "b", "c"} {
		for range 10 {
			mustSubmit(t, r, context.Background(), tenant, job(tenant))
		}
	}
	eventually(t, "the workers are all busy", func() bool { mu.Lock(); defer mu.Unlock(); return total == 3 })
	close(hold)
	drain(t, r)
	if peakTotal != 3 {
		t.Fatalf("peak of %d jobs at once, want the capacity 3", peakTotal)
	}
	for tenant, p := range peak {
		if p > 2 {
			t.Fatalf("tenant %s ran %d jobs at once, over its cap 2", tenant, p)
		}
	}
	if peak["solo"] != 2 {
		t.Fatalf("solo ran at most %d at once, want its cap 2", peak["solo"])
	}
	if s := g.Stat(); s.Acquired != 40 || s.InUse != 0 {
		t.Fatalf("acquired %d, in use %d; want 40 (one per job), 0", s.Acquired, s.InUse)
	}
}

// TestRunnerSurvivesPanics: a panicking job (and one calling
// runtime.Goexit) is reported, keeps no slot and does not stop the
// tenant's later jobs, on a Gate of one worker.
func TestRunnerSurvivesPanics(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 1})
	r, log := newRunner(t, pool.RunnerConfig{Gate: g})
	var ran atomic.Int64
	mustSubmit(t, r, context.Background(), "acme", func(context.Context) { panic("job bug") })
	mustSubmit(t, r, context.Background(), "acme", func(context.Context) { runtime.Goexit() })
	for range 3 {
		mustSubmit(t, r, context.Background(), "acme", func(context.Context) { ran.Add(1) })
	}
	drain(t, r)
	if n := ran.Load(); n != 3 {
		t.Fatalf("%d jobs ran after the panic, want 3", n)
	}
	errs := log.all()
	var pe *pool.PanicError
	if len(errs) != 1 || !errors.As(errs[0], &pe) || pe.Value != "job bug" || pe.Tenant != "acme" || len(pe.Stack) == 0 {
		t.Fatalf("reported %v; want one *PanicError for acme with its value and stack", errs)
	}
	if s := g.Stat(); s.InUse != 0 || s.Acquired != 5 {
		t.Fatalf("in use %d, acquired %d; want 0, 5", s.InUse, s.Acquired)
	}
}

// TestRunnerCloseCancels: a Close whose context ends cancels the running
// job's context, drops the queued jobs (never started) and says how many.
func TestRunnerCloseCancels(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 1})
	r, _ := newRunner(t, pool.RunnerConfig{Gate: g})
	started := make(chan struct{})
	cancelled := make(chan bool, 1)
	mustSubmit(t, r, context.Background(), "acme", func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		cancelled <- true
	})
	var ran atomic.Int64
	for range 5 {
		mustSubmit(t, r, context.Background(), "acme", func(context.Context) { ran.Add(1) })
	}
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var dropped int
	var err error
	go func() { dropped, err = r.Close(ctx); close(done) }()
	select {
	case <-done:
		t.Fatal("Close returned while a job ran and five were queued")
	case <-cancelled:
		t.Fatal("the running job was cancelled before Close gave up")
	default:
	}
	cancel()
	<-done
	if dropped != 5 || !errors.Is(err, context.Canceled) || !<-cancelled || ran.Load() != 0 {
		t.Fatalf("Close: dropped %d, %v, ran %d; want 5 dropped, context.Canceled, none run", dropped, err, ran.Load())
	}
	assertDrained(t, g)
}

// TestRunnerGateClosed: jobs that cannot be admitted (the Gate is closed)
// are each reported, not dropped silently, and Close still returns.
func TestRunnerGateClosed(t *testing.T) {
	g := mustNew(t, pool.Config{Capacity: 1})
	r, log := newRunner(t, pool.RunnerConfig{Gate: g})
	g.Close()
	for range 3 {
		mustSubmit(t, r, context.Background(), "acme", func(context.Context) { t.Error("a job ran on a closed Gate") })
	}
	drain(t, r)
	errs := log.all()
	if len(errs) != 3 {
		t.Fatalf("%d errors reported, want 3: %v", len(errs), errs)
	}
	for _, err := range errs {
		if !errors.Is(err, pool.ErrClosed) {
			t.Fatalf("reported %v, want ErrClosed", err)
		}
	}
}

// TestRunnerBacklogDoesNotDelayOthers is the bulkhead's proof for jobs: a
// tenant with 10,000 jobs queued on W workers delays another tenant's 10
// jobs by no more than one job's duration per worker, beyond what those 10
// take at their fair half of the workers. Without per-tenant round-robin
// they would wait behind the whole backlog: 10,000/W job durations. It is
// judged by how many of the backlog's jobs start while the 10 run, which a
// busy machine does not change.
func TestRunnerBacklogDoesNotDelayOthers(t *testing.T) {
	const (
		workers = 4
		backlog = 10_000
		quietN  = 10
		d       = 50 * time.Millisecond
	)
	g := mustNew(t, pool.Config{Capacity: workers, Plans: map[string]pool.Plan{"p": {MaxConns: workers}}})
	r, _ := newRunner(t, pool.RunnerConfig{Gate: g, MaxQueued: backlog})
	var noisyStarted atomic.Int64
	job := func(started *atomic.Int64) pool.Job {
		return func(ctx context.Context) {
			if started != nil {
				started.Add(1)
			}
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
	}
	for range backlog {
		mustSubmit(t, r, context.Background(), "noisy", job(&noisyStarted))
	}
	eventually(t, "the backlog holds every worker", func() bool { s, _ := g.TenantStat("noisy"); return s.InUse == workers })

	var quietDone sync.WaitGroup
	quietDone.Add(quietN)
	start := time.Now()
	// The backlog's starts from quiet's submission to its last job's
	// start: once that one runs, the backlog has every other worker.
	startedBefore := noisyStarted.Load()
	var quietStarted, lastAt atomic.Int64
	for range quietN {
		mustSubmit(t, r, context.Background(), "quiet", func(ctx context.Context) {
			if quietStarted.Add(1) == quietN {
				lastAt.Store(noisyStarted.Load())
			}
			job(nil)(ctx)
			quietDone.Done()
		})
	}
	quietDone.Wait()
	took := time.Since(start)
	noisyMeanwhile := lastAt.Load() - startedBefore

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dropped, _ := r.Close(ctx)
	assertDrained(t, g)

	fairShare := (quietN + workers/2 - 1) / (workers / 2) // rounds of d at half the workers
	t.Logf("quiet's %d jobs took %.1f d (%d d at half the workers + one per worker on an idle machine); noisy started %d meanwhile; %d dropped at Close",
		quietN, float64(took)/float64(d), fairShare+workers, noisyMeanwhile, dropped)
	// Judged in counts, which no scheduler delay can blur (the time above,
	// in job durations, grows with timers that fire late on a busy
	// machine: 10.9 d beside two busy loops): while quiet's jobs start the
	// backlog gets about one grant per quiet grant, not its whole queue.
	if noisyMeanwhile > quietN+2*workers {
		t.Fatalf("noisy started %d jobs while quiet's %d ran, want at most %d: the workers are not shared round-robin", noisyMeanwhile, quietN, quietN+2*workers)
	}
	if dropped < backlog-int(noisyStarted.Load()) {
		t.Fatalf("Close dropped %d, want the %d never started", dropped, backlog-int(noisyStarted.Load()))
	}
}

// TestRunnerWeights: with two tenants' backlogs contending for the workers,
// the Gate's weighted round-robin decides who runs next: a plan of weight 3
// gets three jobs started for each one of a plan of weight 1. The test
// frees one worker at a time, once every acquirer is back in line, so each
// start is the Gate's choice and not a scheduling accident.
func TestRunnerWeights(t *testing.T) {
	const workers, backlog, rounds = 4, 300, 100
	g := mustNew(t, pool.Config{
		Capacity: workers,
		Plans: map[string]pool.Plan{
			"heavy": {MaxConns: workers, Weight: 3},
			"light": {MaxConns: workers, Weight: 1},
		},
		DefaultPlan: "light",
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			return pool.Tenant{Plan: id}, nil
		},
	})
	r, _ := newRunner(t, pool.RunnerConfig{Gate: g})
	var mu sync.Mutex
	var order []string
	tick := make(chan struct{})
	job := func(tenant string) pool.Job {
		return func(ctx context.Context) {
			mu.Lock()
			order = append(order, tenant)
			mu.Unlock()
			select {
			case <-tick:
			case <-ctx.Done(): // the test failed and its cleanup closes the Runner
			}
		}
	}
	// One job each first, so that the Gate knows both tenants' caps when
	// the backlogs arrive and each gets all its acquirers at once.
	var first sync.WaitGroup
	first.Add(2)
	for _, tenant := range []string{"heavy", "light"} {
		mustSubmit(t, r, context.Background(), tenant, func(context.Context) { first.Done() })
	}
	first.Wait()
	eventually(t, "the first jobs are done", func() bool { return g.Stat().InUse == 0 })
	for range backlog {
		mustSubmit(t, r, context.Background(), "heavy", job("heavy"))
		mustSubmit(t, r, context.Background(), "light", job("light"))
	}
	// Each tenant has one acquirer per job it may run plus a spare: with
	// every worker busy, 2*(workers+1) - workers of them wait.
	settled := func(started int) func() bool {
		return func() bool {
			mu.Lock()
			n := len(order)
			mu.Unlock()
			return n == started && g.Stat().Waiting == workers+2
		}
	}
	eventually(t, "every worker is busy and every acquirer waits", settled(workers))
	for i := range rounds {
		tick <- struct{}{} // one job ends; the Gate picks who starts next
		eventually(t, "the next job starts", settled(workers+i+1))
	}
	mu.Lock()
	n := map[string]int{}
	for _, tenant := range order[workers:] {
		n[tenant]++
	}
	mu.Unlock()
	close(tick)
	drain(t, r)
	ratio := float64(n["heavy"]) / float64(max(1, n["light"]))
	t.Logf("%d jobs started one at a time: heavy %d, light %d (%.2f : 1)", rounds, n["heavy"], n["light"], ratio)
	if ratio < 2.5 || ratio > 3.5 {
		t.Fatalf("heavy started %d and light %d of %d jobs, a ratio of %.2f; want 3 (the weights)", n["heavy"], n["light"], rounds, ratio)
	}
}

// TestRunnerLookupError: a job whose admission fails (the Gate's Lookup
// errs for its tenant) is reported with that error and not run; other
// tenants' jobs run.
func TestRunnerLookupError(t *testing.T) {
	errLookup := errors.New("accounts service down")
	g := mustNew(t, pool.Config{Capacity: 2, Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
		if id == "broken" {
			return pool.Tenant{}, errLookup
		}
		return pool.Tenant{}, nil
	}})
	r, log := newRunner(t, pool.RunnerConfig{Gate: g})
	var ran atomic.Int64
	for range 2 {
		mustSubmit(t, r, context.Background(), "broken", func(context.Context) { t.Error("a job of an unresolvable tenant ran") })
		mustSubmit(t, r, context.Background(), "fine", func(context.Context) { ran.Add(1) })
	}
	drain(t, r)
	var notRun []error // a failure before Close is reported and retried
	for _, err := range log.all() {
		if !errors.Is(err, errLookup) {
			t.Fatalf("reported %v, want only the Lookup error", err)
		}
		if strings.Contains(err.Error(), "not run") {
			notRun = append(notRun, err)
		}
	}
	if len(notRun) != 2 || ran.Load() != 2 {
		t.Fatalf("not run %v, ran %d; want broken's 2 jobs not run and fine's 2 run", notRun, ran.Load())
	}
}

// TestRunnerKeepsItsQueueThroughALookupOutage: while Lookup fails, the
// Runner must not drop the tenant's whole queue to OnError in a tight loop;
// it keeps the jobs and retries, with a pause, and once Lookup answers again
// every job runs.
func TestRunnerKeepsItsQueueThroughALookupOutage(t *testing.T) {
	var down atomic.Bool
	var lookups atomic.Int64
	down.Store(true)
	g := mustNew(t, pool.Config{Capacity: 2, LookupErrorTTL: time.Millisecond,
		Lookup: func(context.Context, string) (pool.Tenant, error) {
			lookups.Add(1)
			if down.Load() {
				return pool.Tenant{}, errors.New("tenant store unreachable")
			}
			return pool.Tenant{}, nil
		}})
	r, log := newRunner(t, pool.RunnerConfig{Gate: g})
	const jobs = 50
	var ran atomic.Int64
	for range jobs {
		mustSubmit(t, r, context.Background(), "acme", func(context.Context) { ran.Add(1) })
	}
	eventually(t, "the Runner tried Lookup", func() bool { return lookups.Load() >= 2 })
	if q := r.Queued("acme"); q != jobs {
		t.Fatalf("%d of %d jobs still queued during the outage (%d errors reported): the queue was dropped", q, jobs, len(log.all()))
	}
	down.Store(false)
	// Close during an outage fails the jobs rather than wait it out, and
	// the Gate answers from its cached Lookup error for LookupErrorTTL
	// after the store is back: Close once the Runner has run a job.
	eventually(t, "a job ran after the outage", func() bool { return ran.Load() > 0 })
	drain(t, r)
	if n := ran.Load(); n != jobs {
		t.Fatalf("%d of %d jobs ran after the outage", n, jobs)
	}
	if len(log.all()) == 0 {
		t.Fatal("the outage was not reported to OnError")
	}
	assertDrained(t, g)
}

// TestRunnerJobMaxHold: a job that runs past its permit's MaxHold (the
// Runner's Gate's plan) has its context ended with DeadlineExceeded, and
// the tenant's HoldTimeouts counts it; a job that ends in time is not
// touched.
func TestRunnerJobMaxHold(t *testing.T) {
	g, err := pool.New(pool.Config{Capacity: 2, Plans: map[string]pool.Plan{"p": {MaxConns: 2, MaxHold: 20 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	r, log := newRunner(t, pool.RunnerConfig{Gate: g})
	ended := make(chan error, 1)
	mustSubmit(t, r, context.Background(), "a", func(ctx context.Context) {
		select {
		case <-ctx.Done():
			ended <- ctx.Err()
		case <-time.After(time.Minute): // a failure, not a hang
			ended <- nil
		}
	})
	if err := <-ended; err != context.DeadlineExceeded {
		t.Fatalf("a job held past its MaxHold: its context ended with %v, want DeadlineExceeded", err)
	}
	quick := make(chan error, 1)
	mustSubmit(t, r, context.Background(), "a", func(ctx context.Context) { quick <- ctx.Err() })
	if err := <-quick; err != nil {
		t.Fatalf("a job within its MaxHold: %v", err)
	}
	drain(t, r)
	if s, _ := g.TenantStat("a"); s.HoldTimeouts != 1 || s.InUse != 0 {
		t.Fatalf("HoldTimeouts %d, InUse %d; want 1, 0", s.HoldTimeouts, s.InUse)
	}
	if errs := log.all(); len(errs) != 0 {
		t.Fatalf("OnError: %v", errs)
	}
}
