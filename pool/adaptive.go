package pool

import (
	"fmt"
	"slices"
	"time"
)

// Adaptive configures adaptive per-tenant limits. A tenant's cap (plan,
// Lookup answer or SetTenantLimit) says how many permits it may ever hold;
// with Adaptive on, its effective limit moves between a floor and that cap,
// driven by its own hold times: when they inflate as its concurrency rises,
// its extra permits only queue inside the shared dependency (a database with
// few cores running CPU-bound queries), so the limit comes down; while they
// do not, and the tenant uses its limit, the limit goes up. Waiting-type work
// (sleeps, calls to slow remote services) does not inflate with concurrency
// and keeps its whole cap.
//
// A request over the effective limit but under the cap waits for the
// effective limit, outside the plan's MaxWaiting: a plan that rejects over
// its cap (MaxWaiting 0) still rejects only over its cap. Such waits are
// bounded by the cap, the plan's MaxWait and the caller's context.
//
// The zero value is off.
type Adaptive struct {
	// Enabled turns adaptive limits on. Every permit's hold time is then
	// measured (one clock read per admission and per release).
	Enabled bool

	// MinConns is the floor of every tenant's effective limit, and where a
	// tenant starts: a limit is only raised on evidence. A tenant's floor is
	// never above its cap, and never below its plan's ReservedConns (so a
	// reservation stays usable). Default 1: against a database with one core,
	// one CPU-bound query at a time already keeps it busy, and a floor of 2
	// would queue a second one inside it for good.
	MinConns int

	// Tolerance is how much a tenant's hold times may exceed its baseline
	// (the shortest observed at a low limit) before its limit is lowered:
	// 1.3 lowers it once holds take 30% longer than the baseline (plus 1 ms,
	// so the jitter of sub-millisecond work is not taken for queueing).
	// Default 1.3; from 1.05 to 100.
	Tolerance float64

	// ProbeInterval is how often a busy tenant's baseline is measured again:
	// its limit drops to the floor for one window of samples, whose shortest
	// hold becomes the new baseline, and grows again from there. This lets
	// the baseline follow drift upwards (a table that grew, a slower plan);
	// drift downwards is followed at once. Default 2 minutes.
	ProbeInterval time.Duration
}

const (
	defaultAdaptiveMinConns  = 1
	defaultAdaptiveTolerance = 1.3
	minAdaptiveTolerance     = 1.05
	maxAdaptiveTolerance     = 100 // beyond it the tolerated hold could overflow; the limit would never be cut anyway
	defaultProbeInterval     = 2 * time.Minute

	// A limit that was cut is not tried again at once: growth stops below
	// it for firstBackoff windows, and each time trying it inflates again
	// the wait grows fourfold, up to maxBackoff windows. Without the wait a
	// CPU-bound tenant on a one-core database would spend every other
	// window at a limit it has already seen queue.
	firstBackoff = 4
	maxBackoff   = 64

	// minInflatedSamples is the fewest holds, all inflated, on which a
	// window above a limit of one is judged inflated: a window of one would
	// take a tenant's one slow hold, which other tenants' load causes, for
	// queueing of its own, and cut it. Not three: at a limit of two that is
	// a second round of holds, and when several CPU-bound tenants learn at
	// once (each hold as long as all their queries together) the cut came
	// when their bursts were nearly done.
	minInflatedSamples = 2
)

// inflationSlack is added to the tolerated hold time, so that the jitter of
// work that takes well under a millisecond does not look like queueing. A
// variable only so that the stress test can make cuts frequent.
var inflationSlack = int64(time.Millisecond)

func (a Adaptive) withDefaults() (Adaptive, error) {
	if !a.Enabled {
		return a, nil
	}
	if a.MinConns < 0 || a.ProbeInterval < 0 {
		return a, fmt.Errorf("%w: Adaptive.MinConns and ProbeInterval must not be negative", ErrInvalidConfig)
	}
	if a.Tolerance != 0 && !(a.Tolerance >= minAdaptiveTolerance && a.Tolerance <= maxAdaptiveTolerance) {
		return a, fmt.Errorf("%w: Adaptive.Tolerance must be from %v to %v, got %v",
			ErrInvalidConfig, minAdaptiveTolerance, maxAdaptiveTolerance, a.Tolerance)
	}
	if a.MinConns == 0 {
		a.MinConns = defaultAdaptiveMinConns
	}
	if a.Tolerance == 0 {
		a.Tolerance = defaultAdaptiveTolerance
	}
	if a.ProbeInterval == 0 {
		a.ProbeInterval = defaultProbeInterval
	}
	return a, nil
}

// adaptiveLimit is one tenant's limit controller, in the manner of TCP Vegas:
// it compares the shortest hold time of each window of samples with a
// baseline, the shortest hold seen (a tenant starts at its floor, so that is
// a hold at low concurrency). It knows nothing of the
// Gate: it is fed samples and bounds, and answers with a limit, so it can be
// tested with a made-up feed. Its methods are O(1) but held and let,
// O(permits held) at most (the tenant's cap); the Gate calls them under its
// lock.
//
// A window is one round of the limit: as many samples as the limit, of
// permits granted after the limit last changed (earlier ones ran under
// another limit and would blur the signal). At the end of a window:
//   - holds inflated beyond Tolerance: the limit is cut towards the
//     concurrency the baseline suggests, by at most half, not below the floor;
//   - else, if the tenant used its whole limit in the window: it grows,
//     doubling while in slow start (from a cold start or a probe until the
//     first cut), then by one;
//   - else it stays: a limit not used tells nothing about more concurrency.
//
// A cut remembers the limit it came from as a ceiling: growth stops below it
// for a number of windows (the backoff) before the ceiling is tried again;
// each failed try lowers nothing but quadruples the backoff, and a clean
// window at the ceiling forgets it. So a tenant whose holds inflate at 2 on a
// one-core database runs at 1 with a try at 2 every few, then many, windows.
//
// A window above the floor whose first samples, more than half of it, are
// all inflated is cut at once rather than when it completes. A window is
// only judged inflated on at least minInflatedSamples holds: a smaller one
// that is goes on until it has them (or a hold within tolerance).
//
// A window above a limit of two that the tenant kept busy throughout (its
// whole limit held, no hold alone) lasts its mean hold; one that took longer
// than the tolerated hold is cut as an inflated one is (see busySpan).
//
// The first window after a rise above two, if the window before the rise was
// busy and this one is too, goes back to the limit before the rise (which
// becomes its ceiling) when its longest hold is over Tolerance times that
// window's longest. Its shortest hold cannot tell: a tenant that sends scans
// and waits in turn always has a wait there, and while the scans pile up
// (a limit cannot revoke) its waits keep the window short. Its longest hold
// can: a wait takes as long at four as at two, a scan beside more scans does
// not.
//
// An inflated window above a limit of one that has a hold no other permit of
// the tenant ran beside, itself inflated, takes that hold as the baseline
// and is judged by its other holds (see outsideSlowdown).
//
// A tenant that ran into its limit and then holds none, with none waiting,
// starts its next burst as a new tenant does, at two at most (see emptied).
//
// Slow start doubles a limit of two or more only on a window of like holds
// (its longest within Tolerance of its shortest) while no permit still held
// has been out for longer than Tolerance times its longest; otherwise it
// grows by one. A window closes on its first holds to end: a tenant that
// sends scans and waits in turn closed its window at two on two waits while
// a scan was still out, and doubled to four scans at once (see doubles).
//
// The baseline falls at once with any shorter hold. To follow it upwards, a
// window at the floor older than ProbeInterval replaces it; a busy tenant
// above its floor is sent there for one window (a probe) to get one.
type adaptiveLimit struct {
	limit     int   // current limit, within [floor, cap]
	slowStart bool  // double on growth (until the first cut)
	baseline  int64 // ns: shortest hold seen; 0 until the first sample
	baseLimit int   // the limit when the baseline was set
	measured  int64 // clock when the baseline was last set
	// changed is the clock of the last limit change: permits granted before
	// it are not in the window, unless the change was a rise (not cut) and
	// they were granted after prevChanged, the change before.
	changed, prevChanged int64
	cut                  bool
	// ceiling is the lowest limit whose window was cut since the last
	// probe, 0 if none; growth waits wait more windows before trying it
	// again, and backoff is the wait after the next failed try.
	ceiling, wait, backoff int
	cutHold                int64 // ns: the hold that called for the last cut (its window's shortest, or a step's longest), 0 if none
	n                      int   // samples in the window
	winMin                 int64 // shortest hold in the window
	winMax                 int64 // longest hold in the window
	// stepMax is the longest hold of the busy window that ended in the
	// last rise, while the window after that rise is open; 0 otherwise.
	stepMax   int64
	stepLimit int // the limit before that rise
	peak      int // most permits held at once in the window
	// soloMin and sharedMin are the shortest holds in the window of permits
	// held alone (no other permit of the tenant at any time while held) and
	// of the others, 0 if none; overlapped says whether the tenant held two
	// or more at once since it last held none.
	soloMin, sharedMin int64
	overlapped         bool
	// winStart is the clock when the window began, 0 if it began at a cut
	// (its permits then wait for the older ones to drain); drained says
	// whether the tenant held fewer than its limit at a release in it.
	winStart int64
	drained  bool
	// full says whether the tenant held its whole limit since it last held
	// none (see emptied).
	full bool
	// out holds the grant clocks of the permits the tenant holds, oldest
	// first (see held and let).
	out []int64
}

// newAdaptiveLimit returns a controller for a new tenant: at its floor, in
// slow start, with no baseline.
func newAdaptiveLimit(floor int, now int64) *adaptiveLimit {
	return &adaptiveLimit{limit: floor, slowStart: true, measured: now, winStart: now}
}

// bound keeps the limit within [floor, cap] after either changed.
func (a *adaptiveLimit) bound(floor, cap int) int {
	floor = min(floor, cap)
	if a.limit < floor {
		a.limit = floor
	} else if a.limit > cap {
		a.limit = cap
	}
	return a.limit
}

// granted notes that the tenant now holds inUse permits.
func (a *adaptiveLimit) granted(inUse int) {
	if inUse > a.peak {
		a.peak = inUse
	}
	a.overlapped = inUse > 1 // at one, the tenant held none before
	if inUse >= a.limit {
		a.full = true
	}
}

// held notes a permit granted at start, which the tenant now holds. Grants
// come nearly in clock order (a fast-path grant reads the clock before the
// Gate's lock), so it is put in place from the end, keeping out oldest first.
func (a *adaptiveLimit) held(start int64) {
	i := len(a.out)
	for i > 0 && a.out[i-1] > start {
		i--
	}
	a.out = slices.Insert(a.out, i, start)
}

// let forgets the permit granted at start, released or never handed out; a
// start it does not know (a permit granted before the controller existed)
// is ignored. It is O(permits held), at most the tenant's cap.
func (a *adaptiveLimit) let(start int64) {
	for i := len(a.out) - 1; i >= 0; i-- {
		if a.out[i] == start {
			a.out = append(a.out[:i], a.out[i+1:]...)
			return
		}
	}
}

// oldestOut is how long, at now, the permit held longest has been out; 0
// if none is held.
func (a *adaptiveLimit) oldestOut(now int64) int64 {
	if len(a.out) == 0 {
		return 0
	}
	return now - a.out[0]
}

// observe feeds one released permit (see let): granted at start, held for hold ns,
// released at now, when the tenant still holds inUse permits. It returns the
// new limit.
func (a *adaptiveLimit) observe(start, hold, now int64, inUse int, cfg *Adaptive, floor, cap int) int {
	a.let(start)
	floor = min(floor, cap)
	hold = max(hold, 1)
	if hold < a.baseline || a.baseline == 0 {
		a.baseline, a.measured, a.baseLimit = hold, now, a.limit
	}
	if start < a.changed && (a.cut || start < a.prevChanged) {
		// Granted under an earlier limit. After a rise, permits of the
		// window before count too: they overlap the new one, and without
		// them a window would close a round late, as the requests granted
		// while it was closing are left out.
		return a.limit
	}
	a.n++
	if inUse+1 < a.limit {
		a.drained = true
	}
	if a.n == 1 || hold < a.winMin {
		a.winMin = hold
	}
	a.winMax = max(a.winMax, hold)
	if inUse == 0 && !a.overlapped {
		a.soloMin = minHold(a.soloMin, hold)
	} else {
		a.sharedMin = minHold(a.sharedMin, hold)
	}
	old := a.limit
	if a.n < old {
		// An early cut: once more than half of a window's samples are in
		// and every one was inflated, the step that caused it is cut now
		// rather than a round later, so a CPU-bound tenant's probes above
		// its floor (slow start's doubling, each +1) queue the database
		// for half as long. Work that does not inflate is never cut early.
		if old <= floor || 2*a.n <= old || a.n < minInflatedSamples || a.winMin <= a.tolerated(cfg) {
			return old
		}
		if a.outsideSlowdown(cfg, now) && a.winMin <= a.tolerated(cfg) {
			return old
		}
		a.cutTowards(floor, a.tolerated(cfg))
		a.endWindow(inUse, now, old)
		a.prevChanged, a.changed, a.cut = a.changed, now, true
		a.winStart = 0
		return a.limit
	}

	// The window is complete.
	stale := now-a.measured > int64(cfg.ProbeInterval)
	if stale && old <= floor {
		// A window at the floor measures the baseline again: a probe's, or
		// that of a tenant that never needed more.
		a.baseline, a.measured, a.baseLimit, stale = a.winMin, now, old, false
	}
	if !stale && old > 1 && a.winMin > a.tolerated(cfg) {
		a.outsideSlowdown(cfg, now)
	}
	tolerated, busy := a.tolerated(cfg), a.busySpan(now)
	if !stale && a.winMin > tolerated && a.n < minInflatedSamples && old > 1 {
		// Too few samples to call the holds inflated: one or two slow
		// holds happen to any tenant on a busy database. The window goes
		// on until a hold within tolerance or minInflatedSamples of them.
		// At a limit of one nothing is cut (see below): one hold will do.
		return old
	}
	switch {
	case stale:
		// Probe: measure the baseline again, at the floor, then grow anew.
		a.limit, a.slowStart = floor, true
		a.ceiling, a.wait, a.backoff = 0, 0, 0
	case a.winMin > tolerated && old == 1:
		// Inflated at a limit of one: nothing to cut, and with no other
		// permit of its own running, the hold is what one of this tenant's
		// queries takes now (other tenants or the machine are slower). It
		// becomes the baseline, as a probe's window would. If it is about
		// as long as the holds of the window last cut, the tenant's own
		// concurrency did not cause that inflation (others' load did): the
		// ceiling goes, and slow start resumes.
		a.baseline, a.measured, a.baseLimit = a.winMin, now, old
		if a.ceiling > 0 && float64(a.winMin)*cfg.Tolerance >= float64(a.cutHold) {
			a.ceiling, a.wait, a.backoff, a.slowStart = 0, 0, 0, true
		}
	case a.winMin > tolerated:
		a.cutTowards(floor, tolerated)
	case old > 2 && busy > tolerated:
		// Busy throughout, the window took longer than a tolerated hold:
		// its holds were inflated on average, whatever its shortest.
		a.winMin = busy
		a.cutTowards(floor, tolerated)
	case old > 2 && a.stepMax > 0 && !a.drained && a.winMax > int64(float64(a.stepMax)*cfg.Tolerance)+inflationSlack:
		// The step's longest hold inflated: back to the limit before it.
		a.cutTo(floor, a.stepLimit, a.winMax)
	case a.peak >= old:
		a.grow(cap, a.doubles(cfg, now))
	default:
		a.wait = max(0, a.wait-1)
	}
	a.endWindow(inUse, now, old)
	if a.limit != old {
		a.prevChanged, a.changed, a.cut = a.changed, now, a.limit < old
		if a.cut {
			a.winStart = 0
		}
	}
	return a.limit
}

// outsideSlowdown is called on an inflated window above a limit of one. If
// the window has a hold that no other permit of the tenant ran beside, and
// that hold is inflated too, the tenant's own concurrency cannot have caused
// it (others' load did): it becomes the baseline, as a hold at a limit of
// one does, and the window is judged by its other holds against it (winMin
// becomes the shortest of them). Without it a tenant whose requests seldom
// overlap (a quiet tenant's short reads beside another tenant's scans) was
// cut for others' load, and its requests queued at its own gate. It reports
// whether the baseline was taken.
func (a *adaptiveLimit) outsideSlowdown(cfg *Adaptive, now int64) bool {
	if a.soloMin == 0 || a.soloMin <= a.tolerated(cfg) {
		return false
	}
	a.baseline, a.measured, a.baseLimit = a.soloMin, now, 1
	a.winMin = a.soloMin
	if a.sharedMin > 0 {
		a.winMin = a.sharedMin
	}
	return true
}

// busySpan is how long the window has taken if the tenant held its whole
// limit throughout it (a backlog, and no hold alone), else 0. Releasing as
// many permits as it holds, such a window lasts its mean hold (Little's law),
// which a few short holds cannot hide as they hide the shortest: a tenant
// that sends scans and waits in turn always has a wait there that does not
// inflate, while the scans beside it queue the core.
func (a *adaptiveLimit) busySpan(now int64) int64 {
	if a.winStart == 0 || a.drained || a.soloMin != 0 || a.peak < a.limit {
		return 0
	}
	return now - a.winStart
}

// endWindow starts a new window at now, with inUse permits held after a
// release at limit old (one less than old if the tenant was busy). If the
// limit rose from old and the window was busy, its longest hold is kept to
// judge the step by (stepMax).
func (a *adaptiveLimit) endWindow(inUse int, now int64, old int) {
	a.stepMax, a.stepLimit = 0, 0
	if a.limit > old && a.peak >= old && !a.drained {
		a.stepMax, a.stepLimit = a.winMax, old
	}
	a.n, a.peak, a.soloMin, a.sharedMin, a.winMax = 0, inUse, 0, 0, 0
	a.winStart, a.drained = now, inUse+1 < old
}

func minHold(m, hold int64) int64 {
	if m == 0 || hold < m {
		return hold
	}
	return m
}

// tolerated is the longest hold, in ns, not taken for queueing at the
// current limit: Tolerance times the baseline, or, when the limit is well
// above the one the baseline was measured at, the baseline grown in
// proportion to the limit, over Tolerance. Holds that grow as fast as the
// limit mean more permits bring no more throughput (the tenant only queues
// itself); holds that grow slower mean each extra permit still gets work
// done, as a tenant sharing a saturated core with others gets a larger
// share of it by running more at once, and cutting it would only queue its
// requests at the gate while the others take the core. Up to twice the
// baseline's limit only Tolerance counts: when several CPU-bound tenants
// double together from one, each one's holds double too, and a baseline of
// one hold is noisy enough to bring that under 2/Tolerance (1.54x), so all
// of them grew and queued the core for everyone.
func (a *adaptiveLimit) tolerated(cfg *Adaptive) int64 {
	factor := cfg.Tolerance
	if a.baseLimit > 0 && a.limit > 2*a.baseLimit {
		factor = max(factor, float64(a.limit)/float64(a.baseLimit)/cfg.Tolerance)
	}
	return int64(float64(a.baseline)*factor) + inflationSlack
}

// doubles says whether slow start may double the limit at the end of this
// window, at now: from one always, from more only if the window's holds were
// alike (its longest within Tolerance of its shortest) and no permit still
// held has been out longer than Tolerance times its longest. Holds of
// different lengths may be scans beside waits, where the scans queue the
// database and only the waits gain from more permits; doubling then grants
// the scans twice the concurrency at once, which no cut can take back until
// they end, while growing by one tries a single extra permit.
func (a *adaptiveLimit) doubles(cfg *Adaptive, now int64) bool {
	if !a.slowStart || a.limit < 2 {
		return a.slowStart
	}
	alike := int64(float64(a.winMin)*cfg.Tolerance) + inflationSlack
	return a.winMax <= alike && a.oldestOut(now) <= int64(float64(a.winMax)*cfg.Tolerance)+inflationSlack
}

// grow raises the limit after a used window without inflation: doubling if
// double (see doubles), else by one, up to cap; never to the ceiling a cut
// left until the backoff has passed. A clean window at the ceiling forgets
// it.
func (a *adaptiveLimit) grow(cap int, double bool) {
	old := a.limit
	if a.ceiling > 0 && old >= a.ceiling {
		a.ceiling, a.wait, a.backoff = 0, 0, 0 // the ceiling no longer inflates
	}
	next := old + 1
	if double {
		next = 2 * old
	}
	next = min(cap, next)
	if a.ceiling > 0 && next >= a.ceiling {
		if a.wait > 0 {
			a.wait--
			next = min(next, a.ceiling-1)
		} else {
			next = a.ceiling // try the ceiling itself, not beyond
		}
	}
	a.limit = max(old, next)
}

// cutTowards lowers the limit towards the concurrency at which the window's
// shortest hold would have been tolerated, at most by half, not below floor,
// and ends slow start. The limit it came from becomes the ceiling, with a
// longer backoff if it was the ceiling already.
func (a *adaptiveLimit) cutTowards(floor int, tolerated int64) {
	old := a.limit
	want := int(float64(old) * float64(tolerated) / float64(a.winMin))
	a.cutTo(floor, max(want, old/2), a.winMin)
}

// cutTo lowers the limit to want, not below floor and by one at least, and
// ends slow start; hold is the inflated hold that called for it (cutHold).
// The limit it came from becomes the ceiling, with a longer backoff if it
// was the ceiling already.
func (a *adaptiveLimit) cutTo(floor, want int, hold int64) {
	old := a.limit
	a.limit = max(floor, min(old-1, want))
	a.slowStart = false
	if a.limit == old {
		return
	}
	a.cutHold = hold
	if a.ceiling > 0 && old >= a.ceiling {
		a.backoff = min(maxBackoff, 4*a.backoff) // the ceiling was tried again and inflated again
	} else {
		a.ceiling, a.backoff = old, firstBackoff
	}
	a.wait = a.backoff
}

// restartLimit is the highest limit a tenant that ran into its limit keeps
// when it empties (see emptied).
const restartLimit = 2

// emptied notes that the tenant holds none of its permits and has none
// waiting. If it held its whole limit since it last emptied, that burst is
// done and the next may be of another shape, so it starts as a new tenant
// does: in slow start, with no ceiling, at its limit or restartLimit if
// lower. A burst of scans after a burst of waits is then not granted the
// waits' limit at once (a limit cannot revoke a permit, and no scan's hold is
// seen before it ends), nor a burst of waits after scans held below the
// scans' ceiling for its backoff. The cost: a tenant whose bursts of work that
// does not inflate need more than two at once doubles back on each (eight
// waits at once take three rounds of them instead of one). It returns the
// new limit.
func (a *adaptiveLimit) emptied(now int64, floor, cap int) int {
	a.out = a.out[:0] // none held: forget any start let missed
	if !a.full {
		return a.limit
	}
	a.full = false
	a.slowStart = true
	a.ceiling, a.wait, a.backoff = 0, 0, 0
	next := max(min(floor, cap), min(a.limit, restartLimit))
	if next >= a.limit {
		return a.limit
	}
	a.limit = next
	a.endWindow(0, now, next)
	a.prevChanged, a.changed, a.cut = a.changed, now, true
	a.winStart = 0
	return a.limit
}
