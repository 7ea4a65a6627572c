package pool

import (
	"context"
	"errors"
	"fmt"
	"log"
	"runtime/debug"
	"sync"
	"time"
)

// ErrRunnerClosed is returned by Runner.Submit after Close was called.
var ErrRunnerClosed = errors.New("pool: runner closed")

// Job is a unit of background work. Its context carries the tenant
// (TenantFrom) and the values of the context it was submitted with, and is
// cancelled when Runner.Close gives up draining, or once the job has run
// for its permit's MaxHold (the Runner's Gate's Plan.MaxHold, a Lookup's,
// a class's): then its Err is context.DeadlineExceeded and the tenant's
// TenantStat.HoldTimeouts counts it.
type Job func(ctx context.Context)

// PanicError is what RunnerConfig.OnError receives for a job that panicked.
type PanicError struct {
	Tenant string
	Value  any    // what the job panicked with
	Stack  []byte // the job's goroutine stack at the panic
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("pool: job of tenant %q panicked: %v", e.Tenant, e.Value)
}

// RunnerConfig configures a Runner. Zero values mean the documented
// defaults; only Gate is required.
type RunnerConfig struct {
	// Gate admits every job: its capacity is the number of jobs run at once
	// (the workers), a tenant's cap how many of its jobs run at once, and
	// plan weights share the workers between tenants with queued jobs.
	// Required; give the Runner a Gate of its own: a job that asks the
	// Runner's Gate for another slot (a tenantdb.Pool whose Gate this is)
	// gets ErrRunnerOwnGate.
	Gate *Gate

	// MaxQueued is how many jobs one tenant may have queued (submitted and
	// not started), per class; past it Submit returns an *OverLimitError.
	// Default 1,000.
	MaxQueued int

	// OnError is told about every job that did not run to completion: a job
	// that panicked (a *PanicError; the worker and the slot survive it) and
	// a job whose admission failed for good (the Gate was closed, Lookup
	// said the tenant or its plan is invalid: the job is not run), and a
	// transient admission failure (Lookup failed, too many tenants: the
	// jobs stay queued and are retried after a pause of LookupErrorTTL, at
	// least 100ms, until Close is called).
	// It is called from the job's goroutine, outside any lock. Default: log
	// the error with the standard logger.
	OnError func(tenant string, err error)
}

const defaultMaxQueued = 1000

// Runner runs background jobs per tenant on a Gate. Each tenant has its own
// bounded FIFO queue; a job runs once the Gate grants its tenant a permit,
// so at most the Gate's capacity of jobs run at once, at most a tenant's cap
// of its own, and when the workers are contended tenants with queued jobs
// are served in weighted round-robin order by the Gate, not in submission
// order: a tenant's backlog of thousands delays another tenant's jobs by
// about one job per worker, not by the backlog.
//
// A Runner keeps, per tenant and class with queued jobs, at most its limit
// plus one of goroutines asking the Gate for permits; the one over the cap waits
// whatever the plan's MaxWaiting and MaxWait, so that the tenant is in the
// Gate's round-robin whenever one of its jobs ends. Create it with NewRunner.
type Runner struct {
	g         *Gate
	maxQueued int
	onError   func(string, error)
	ctx       context.Context // cancelled when Close gives up draining
	cancel    context.CancelFunc
	wg        sync.WaitGroup // acquirer goroutines

	mu      sync.Mutex
	closed  bool                     // guarded by mu
	tenants map[queueKey]*tenantJobs // guarded by mu: tenants (and classes) with queued jobs or acquirers
	idle    chan struct{}            // guarded by mu: closed when tenants empties after Close
}

// queueKey names one queue of a Runner: a tenant's jobs of one class.
type queueKey struct {
	tenant string
	class  *classState
}

// tenantJobs is one tenant's queue of one class and the goroutines serving it.
type tenantJobs struct {
	key       queueKey
	acquire   context.Context // the Runner's context, with the class
	queue     []queuedJob     // guarded by Runner.mu: FIFO from head
	head      int             // guarded by Runner.mu
	acquirers int             // guarded by Runner.mu: goroutines acquiring or running for the tenant
	claimed   int             // guarded by Runner.mu: acquirers asking the Gate, each for one queued job
}

type queuedJob struct {
	ctx context.Context // the submitter's, for its values only
	job Job
}

func (q *tenantJobs) len() int { return len(q.queue) - q.head }

func (q *tenantJobs) pop() (queuedJob, bool) {
	if q.len() == 0 {
		return queuedJob{}, false
	}
	j := q.queue[q.head]
	q.queue[q.head] = queuedJob{}
	q.head++
	if q.head == len(q.queue) {
		q.queue, q.head = q.queue[:0], 0
	} else if q.head > 64 && q.head*2 >= len(q.queue) {
		n := copy(q.queue, q.queue[q.head:])
		clear(q.queue[n:])
		q.queue, q.head = q.queue[:n], 0
	}
	return j, true
}

// NewRunner returns a Runner on cfg.Gate, or an error wrapping
// ErrInvalidConfig.
func NewRunner(cfg RunnerConfig) (*Runner, error) {
	if cfg.Gate == nil {
		return nil, fmt.Errorf("%w: RunnerConfig.Gate is required", ErrInvalidConfig)
	}
	if cfg.MaxQueued < 0 {
		return nil, fmt.Errorf("%w: RunnerConfig.MaxQueued must not be negative, got %d", ErrInvalidConfig, cfg.MaxQueued)
	}
	if cfg.MaxQueued == 0 {
		cfg.MaxQueued = defaultMaxQueued
	}
	if cfg.OnError == nil {
		cfg.OnError = func(tenant string, err error) { log.Printf("pool: runner: tenant %q: %v", tenant, err) }
	}
	cfg.Gate.runners.Store(true) // before any job's context exists
	ctx, cancel := context.WithCancel(context.Background())
	ctx = context.WithValue(ctx, runnerKey{}, true)
	return &Runner{g: cfg.Gate, maxQueued: cfg.MaxQueued, onError: cfg.OnError,
		ctx: ctx, cancel: cancel, tenants: make(map[queueKey]*tenantJobs)}, nil
}

// Submit queues job for tenantID and returns at once; the job runs later,
// in a goroutine of the Runner. It returns an error, and the job is not
// queued, when the tenant ID is invalid (ErrInvalidTenant), ctx has ended,
// the Runner is closed (ErrRunnerClosed), or the tenant already has
// MaxQueued jobs queued: an *OverLimitError (errors.Is ErrOverLimit) with a
// RetryAfter estimated from its jobs' run times. A job is admitted as work
// of the class ctx carries (WithClass; ErrUnknownClass if the Gate has no
// such class), and each tenant's jobs of each class queue apart, so a
// tenant's batch backlog does not hold up its other jobs. ctx governs only
// the submission; the job's context keeps ctx's values but not its
// cancellation, so a queued job is never dropped silently.
func (r *Runner) Submit(ctx context.Context, tenantID string, job Job) error {
	if job == nil {
		return errors.New("pool: Submit: nil job")
	}
	if err := validateID(tenantID, r.g.cfg.MaxTenantIDLen); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pool: submit for tenant %q: %w", tenantID, err)
	}
	class, err := r.g.classOf(ctx)
	if err != nil {
		return fmt.Errorf("pool: submit for tenant %q: %w", tenantID, err)
	}
	key := queueKey{tenantID, class}
	limit := r.limit(key)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrRunnerClosed
	}
	q := r.tenants[key]
	if q == nil {
		q = &tenantJobs{key: key, acquire: r.ctx}
		if class.index != 0 {
			q.acquire = WithClass(r.ctx, class.name)
		}
		r.tenants[key] = q
	}
	if q.len() >= r.maxQueued {
		queued := q.len()
		r.mu.Unlock()
		return r.overLimit(key, queued)
	}
	q.queue = append(q.queue, queuedJob{ctx: ctx, job: job})
	more := r.moreAcquirersLocked(q, limit)
	r.mu.Unlock()
	for range more {
		go r.serve(tenantID, q)
	}
	return nil
}

// limit is how many acquirers a queue may have: one per job its tenant may
// run at once of its class (its effective limit on the Gate) and one spare,
// which waits over the limit so that the tenant is in the Gate's
// round-robin the moment one of its jobs releases a worker; without it a
// tenant at its cap could only take turns with the others, whatever its
// weight. A tenant the Gate does not track yet gets one, which starts the
// others once the Gate knows its cap.
func (r *Runner) limit(key queueKey) int {
	limit, _, ok := r.g.classLimit(key.tenant, key.class)
	if !ok {
		return 1
	}
	return max(1, limit) + 1
}

// classLimit returns tenantID's effective limit for work of class c, its
// moving average hold time, and false when the tenant is not tracked.
func (g *Gate) classLimit(tenantID string, c *classState) (limit int, avgHold time.Duration, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.tenants[tenantID]
	if t == nil {
		return 0, 0, false
	}
	if t.planVersion != t.plan.version {
		g.applyLimitLocked(t)
	}
	limit, avgHold = t.limit, time.Duration(t.avgHold)
	if c.index != 0 && t.wait != nil {
		l := &t.wait.lanes[c.index]
		limit = g.laneLimitLocked(l)
		if l.avgHold > 0 {
			avgHold = time.Duration(l.avgHold)
		}
	} else if c.index != 0 {
		limit = min(t.plan.classCaps[c.index], t.cap)
	}
	return limit, avgHold, true
}

// runnerKey marks the context of a Runner's requests to its Gate: over
// their tenant's limit they wait regardless of the plan's MaxWaiting and
// MaxWait, as the Runner keeps at most one such spare per tenant and
// bounds the tenant's queue itself (RunnerConfig.MaxQueued).
type runnerKey struct{}

func isRunnerRequest(ctx context.Context) bool { return ctx.Value(runnerKey{}) != nil }

// jobKey marks the context of a Runner's job with the Runner's Gate, which
// refuses the job's own requests (ErrRunnerOwnGate).
type jobKey struct{}

func jobOf(ctx context.Context) *Gate {
	g, _ := ctx.Value(jobKey{}).(*Gate)
	return g
}

// overLimit is the error for a queue that is full.
func (r *Runner) overLimit(key queueKey, queued int) error {
	limit, hold, _ := r.g.classLimit(key.tenant, key.class)
	s, _ := r.g.TenantStat(key.tenant)
	if hold <= 0 {
		hold = unknownHold
	}
	retry := hold * time.Duration(queued/max(1, limit)+1)
	e := &OverLimitError{Tenant: key.tenant, Limit: s.Limit,
		RetryAfter: min(max(retry, time.Millisecond), r.g.cfg.MaxRetryAfter)}
	if key.class.index != 0 {
		e.Class = key.class.name
	}
	return e
}

// Queued returns how many of tenantID's jobs, of every class, are queued,
// not started.
func (r *Runner) Queued(tenantID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.g.classes {
		if q := r.tenants[queueKey{tenantID, c}]; q != nil {
			n += q.len()
		}
	}
	return n
}

// serve is one acquirer of tenantID: it claims a queued job, takes a
// permit, then the tenant's next job, runs it and starts over, until no
// queued job is left unclaimed. Claiming first means no permit is taken
// for a job another acquirer runs; taking the job only once the permit is
// granted keeps the tenant's jobs in FIFO order; asking the Gate for every
// job is what lets its round-robin rotate the tenants.
func (r *Runner) serve(tenantID string, q *tenantJobs) {
	left := false // whether this acquirer has been retired from q
	defer func() {
		if !left { // a job called runtime.Goexit: a new acquirer takes over
			r.mu.Lock()
			replace := q.len() > 0
			if replace {
				r.wg.Add(1)
			} else {
				r.leaveLocked(tenantID, q)
			}
			r.mu.Unlock()
			if replace {
				go r.serve(tenantID, q)
			}
		}
		r.wg.Done()
	}()
	for {
		r.mu.Lock()
		if q.claimed >= q.len() { // every queued job has an acquirer already
			r.leaveLocked(tenantID, q)
			left = true
			r.mu.Unlock()
			return
		}
		q.claimed++
		r.mu.Unlock()
		permit, err := r.g.Acquire(q.acquire, tenantID)
		var limit int
		if err == nil {
			limit = r.limit(q.key)
		}
		r.mu.Lock()
		q.claimed--
		if err != nil {
			r.mu.Unlock()
			if !r.admissionFailed(tenantID, q, err) {
				left = true
				return
			}
			continue
		}
		j, ok := q.pop()
		if !ok { // Close dropped the queue
			r.leaveLocked(tenantID, q)
			left = true
			r.mu.Unlock()
			permit.Release()
			return
		}
		more := r.moreAcquirersLocked(q, limit)
		r.mu.Unlock()
		for range more {
			go r.serve(tenantID, q)
		}
		r.run(tenantID, permit, j)
	}
}

// moreAcquirersLocked counts (and registers) the acquirers to start so
// that q has as many as the tenant may run jobs at once, limit, or as it
// has jobs queued, whichever is fewer.
func (r *Runner) moreAcquirersLocked(q *tenantJobs, limit int) int {
	n := min(limit, q.acquirers+q.len()) - q.acquirers
	if n <= 0 {
		return 0
	}
	q.acquirers += n
	r.wg.Add(n)
	return n
}

// leaveLocked retires one acquirer of q; the last one removes the tenant.
func (r *Runner) leaveLocked(tenantID string, q *tenantJobs) {
	q.acquirers--
	if q.acquirers == 0 && q.len() == 0 {
		delete(r.tenants, q.key)
		if r.closed && len(r.tenants) == 0 && r.idle != nil {
			close(r.idle)
			r.idle = nil
		}
	}
}

// admissionFailed handles an Acquire error and reports whether the
// acquirer goes on. Over its cap (its limit was cut, or the Gate's permits
// are also taken outside the Runner), an acquirer that is not the tenant's
// last leaves; the last one retries after RetryAfter. A transient failure
// (Lookup failed, too many tenants) is told to OnError and retried the same
// way after a pause, the jobs kept. Any other error fails the tenant's next
// job, which OnError is told about, unless the Runner's context ended: Close
// has dropped the queue then.
func (r *Runner) admissionFailed(tenantID string, q *tenantJobs, err error) bool {
	if r.ctx.Err() != nil {
		r.mu.Lock()
		r.leaveLocked(tenantID, q)
		r.mu.Unlock()
		return false
	}
	var ole *OverLimitError
	retryAfter := time.Duration(0)
	switch {
	case errors.As(err, &ole):
		retryAfter = ole.RetryAfter
	case transient(err) && !r.isClosed():
		retryAfter = max(r.g.cfg.LookupErrorTTL, minRetryPause)
	}
	if retryAfter > 0 {
		r.mu.Lock()
		if q.acquirers > 1 || q.len() == 0 {
			r.leaveLocked(tenantID, q)
			r.mu.Unlock()
			return false
		}
		r.mu.Unlock()
		if ole == nil {
			r.onError(tenantID, fmt.Errorf("pool: jobs of tenant %q wait: %w", tenantID, err))
		}
		t := time.NewTimer(retryAfter)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.ctx.Done():
		}
		return true
	}
	r.mu.Lock()
	_, ok := q.pop()
	if !ok || q.len() == 0 {
		r.leaveLocked(tenantID, q)
	}
	goOn := ok && q.len() > 0
	r.mu.Unlock()
	if ok {
		r.onError(tenantID, fmt.Errorf("pool: job of tenant %q not run: %w", tenantID, err))
	}
	return goOn
}

// isClosed reports whether Close was called: a transient failure then fails
// the job instead of keeping Close waiting for an outage to end.
func (r *Runner) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// minRetryPause is the shortest pause of a Runner after a transient
// admission failure.
const minRetryPause = 100 * time.Millisecond

// transient reports whether an admission failure may pass by itself: a
// failed Lookup (not one that says the tenant or its plan is invalid) or too
// many tenants tracked. A closed Gate, an invalid tenant, class or plan are
// not.
func transient(err error) bool {
	switch {
	case errors.Is(err, ErrClosed), errors.Is(err, ErrInvalidTenant), errors.Is(err, ErrUnknownClass),
		errors.Is(err, ErrUnknownPlan), errors.Is(err, ErrInvalidConfig), errors.Is(err, ErrRunnerOwnGate):
		return false
	}
	return true
}

// run runs one job holding permit, and releases it on every path; a panic
// is reported to OnError, after the release, and goes no further. The
// job's context ends at the permit's MaxHold, if it has one.
func (r *Runner) run(tenantID string, permit Permit, j queuedJob) {
	base := WithTenant(context.WithValue(context.WithoutCancel(j.ctx), jobKey{}, r.g), tenantID)
	ctx, cancel := context.WithCancel(base)
	maxHold := permit.MaxHold()
	if maxHold > 0 {
		ctx, cancel = context.WithTimeout(base, maxHold)
	}
	stop := context.AfterFunc(r.ctx, cancel)
	defer func() {
		v := recover()
		var stack []byte
		if v != nil {
			stack = debug.Stack()
		}
		stop()
		if maxHold > 0 && ctx.Err() == context.DeadlineExceeded {
			permit.Exceeded(LimitMaxHold)
		}
		cancel()
		permit.Release()
		if v != nil {
			r.onError(tenantID, &PanicError{Tenant: tenantID, Value: v, Stack: stack})
		}
	}()
	j.job(ctx)
}

// Close stops taking jobs (Submit returns ErrRunnerClosed) and waits until
// every queued job has run. If ctx ends first, it cancels the contexts of
// the jobs running, drops the jobs still queued, waits for the running ones
// to return, and reports how many it dropped with ctx's error. Close does
// not close the Gate. Calling it again waits again.
func (r *Runner) Close(ctx context.Context) (dropped int, err error) {
	r.mu.Lock()
	r.closed = true
	var idle chan struct{}
	if len(r.tenants) > 0 {
		if r.idle == nil {
			r.idle = make(chan struct{})
		}
		idle = r.idle
	}
	r.mu.Unlock()
	if idle != nil {
		select {
		case <-idle:
		case <-ctx.Done():
			err = ctx.Err()
			r.cancel()
			r.mu.Lock()
			for _, q := range r.tenants {
				dropped += q.len()
				clear(q.queue)
				q.queue, q.head = nil, 0
			}
			r.mu.Unlock()
		}
	}
	r.wg.Wait()
	return dropped, err
}
