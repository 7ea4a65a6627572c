package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// The oracle scenarios judge adaptive limits by the hindsight-best static
// cap: on one workload, in interleaved rounds on the same one-CPU
// PostgreSQL, the noisy tenant runs under static caps 1, 2, 4 and the
// plan's 10, and under adaptive limits (cap 10, every tenant adaptive),
// while the quiet tenant (cap 10) reads as in the cpu-* scenarios. Which static cap is best depends on the
// workload and on the machine; how far adaptive limits are from it does not.
// Every configuration gets a fresh pool, so the adaptive limit's cold start
// is in its numbers. oracle-multi and oracle-turns also run a try-once
// schedule, what learning by trying costs (see oracleConfig.tryOnce).

// oracleConfig is one limit an oracle round runs the noisy tenants under.
type oracleConfig struct {
	name     string
	cap      int
	adaptive bool
	// tryOnce makes it a schedule, not a cap, and not a candidate for the
	// best static cap: each noisy tenant starts at cap, runs at cap+1 from
	// the end of its first query until the next one ends, then at cap. It is
	// the least a controller pays that holds the best cap but must try one
	// more to learn whether one more helps.
	tryOnce bool
}

// oracleConfigs are the limits every oracle round runs; the last is the
// adaptive one.
var oracleConfigs = []oracleConfig{
	{name: "static 1", cap: 1}, {name: "static 2", cap: 2}, {name: "static 4", cap: 4},
	{name: "static 10", cap: perTenantCap}, {name: "adaptive", cap: perTenantCap, adaptive: true},
}

// The goals for the adaptive limit (docs DESIGN "Measuring an adaptive
// controller"): quiet p50 and noisy makespan within oracleTarget of the best
// static cap's, quiet p99 within oracleTargetP99, and a pure-wait flood's
// makespan within oracleTargetIdeal of its ideal.
const (
	oracleTarget      = 1.2
	oracleTargetP99   = 1.5
	oracleTargetIdeal = 1.1
)

// Workload sizes: a burst of scans is about oracleScanWork of one core's
// time (so a round takes about as long on a slow machine as on a fast one),
// sleeps are oracleSleepN waits of oracleSleep (20 rounds at the cap of 10,
// so the adaptive limit's slow start, 1, 2, 4, 8, is a small part of it),
// and oracleMixSleeps in each burst of waits of oracle-mix.
const (
	oracleScanWork  = 4 * time.Second
	oracleSleepN    = 200
	oracleMixSleeps = 20
	oracleSleep     = 100 * time.Millisecond
	// oracle-flood: oracleFloodN waits of oracleFloodSleep, ideally
	// oracleFloodN/perTenantCap rounds (5 s).
	oracleFloodN     = 100
	oracleFloodSleep = 500 * time.Millisecond
)

// noisyLoad is an oracle workload's noisy side: it sends its queries through
// p and returns when they are all answered. scans is the number of scans of
// a burst, sized to the machine.
type noisyLoad func(ctx context.Context, p *tenantdb.Pool, scans int, out *outcome, mu *sync.Mutex) error

// noisyTenants are the noisy tenants' names; more than one only in
// oracle-multi.
var noisyTenants = []string{"noisy", "noisy2", "noisy3"}

// sendAtOnce sends n queries as tenant at once and waits for them.
func sendAtOnce(ctx context.Context, p *tenantdb.Pool, tenant string, n int, sql func(i int) (string, []any), out *outcome, mu *sync.Mutex, start time.Time) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q, args := sql(i)
			t0 := time.Now()
			_, err := p.Exec(tenantdb.WithTenant(ctx, tenant), q, args...)
			mu.Lock()
			out.record(time.Since(t0), err, time.Since(start))
			mu.Unlock()
		}()
	}
	wg.Wait()
}

func scanSQL(i int) (string, []any) { return cpuNoisySQL, []any{fmt.Sprint(i)} }
func waitSQL(int) (string, []any)   { return waitFor(oracleSleep) }
func waitFor(d time.Duration) (string, []any) {
	return "select pg_sleep($1::float8) /* tenant=noisy */", []any{d.Seconds()}
}

// oracleWorkload is an oracle scenario's noisy side and how it is judged.
type oracleWorkload struct {
	load noisyLoad
	// tenants are the noisy tenants, whose effective limits the timeline records.
	tenants []string
	// configs are the limits it runs under (oracleConfigs unless set); the
	// last is the adaptive one.
	configs []oracleConfig
	// ideal is the makespan no limit can beat, judged with
	// oracleTargetIdeal; zero when there is none to state.
	ideal time.Duration
}

func (w oracleWorkload) limits() []oracleConfig {
	if w.configs != nil {
		return w.configs
	}
	return oracleConfigs
}

var oracleWorkloads = map[string]oracleWorkload{
	// CPU-bound scans, all at once.
	"oracle-cpu": {tenants: noisyTenants[:1], load: func(ctx context.Context, p *tenantdb.Pool, scans int, out *outcome, mu *sync.Mutex) error {
		sendAtOnce(ctx, p, "noisy", scans, scanSQL, out, mu, time.Now())
		return nil
	}},
	// pg_sleep waits, all at once: no database CPU, the plan's cap is best.
	"oracle-sleep": {tenants: noisyTenants[:1], load: func(ctx context.Context, p *tenantdb.Pool, _ int, out *outcome, mu *sync.Mutex) error {
		sendAtOnce(ctx, p, "noisy", oracleSleepN, waitSQL, out, mu, time.Now())
		return nil
	}},
	// The noisy tenant alternates: a burst of scans, a burst of waits, then
	// scans and waits again, each half as large, one after the other on
	// the same pool, so the adaptive limit must follow the change.
	"oracle-mix": {tenants: noisyTenants[:1], load: func(ctx context.Context, p *tenantdb.Pool, scans int, out *outcome, mu *sync.Mutex) error {
		start := time.Now()
		for range 2 {
			sendAtOnce(ctx, p, "noisy", max(1, scans/2), scanSQL, out, mu, start)
			sendAtOnce(ctx, p, "noisy", oracleMixSleeps, waitSQL, out, mu, start)
		}
		return nil
	}},
	// Scans and waits in turn within one burst: query i is a scan when i
	// is even and a wait when odd, all sent at once, so every window of the
	// noisy tenant's holds mixes both shapes (oracle-mix changes shape
	// between bursts). As many queries as oracle-cpu's scans, half of them
	// waits. Also run under "try 3 once": at 2 a window of a scan and a
	// wait looks like waits of two lengths, which more permits would speed
	// up, so a controller must try 3 to learn that they do not.
	"oracle-turns": {tenants: noisyTenants[:1], configs: withTryOnce(oracleConfigs, 2), load: func(ctx context.Context, p *tenantdb.Pool, scans int, out *outcome, mu *sync.Mutex) error {
		sendAtOnce(ctx, p, "noisy", scans, func(i int) (string, []any) {
			if i%2 == 0 {
				return scanSQL(i)
			}
			return waitSQL(i)
		}, out, mu, time.Now())
		return nil
	}},
	// A flood that only waits: oracleFloodN pg_sleep(0.5) at once, cap 10.
	// Its ideal is known (the cap busy throughout: 5 s) and static cap 10
	// reaches it, so only static 10 and adaptive run (caps 1, 2 and 4
	// would take 50, 25 and 12.5 s a round to show what is known).
	"oracle-flood": {
		tenants: noisyTenants[:1],
		configs: []oracleConfig{{name: "static 10", cap: perTenantCap}, {name: "adaptive", cap: perTenantCap, adaptive: true}},
		ideal:   oracleFloodN * oracleFloodSleep / perTenantCap,
		load: func(ctx context.Context, p *tenantdb.Pool, _ int, out *outcome, mu *sync.Mutex) error {
			sendAtOnce(ctx, p, "noisy", oracleFloodN, func(int) (string, []any) { return waitFor(oracleFloodSleep) }, out, mu, time.Now())
			return nil
		}},
	// Three noisy tenants at once, each with a third of the scans; also run
	// under "try 2 once", the floor of a controller that learns.
	"oracle-multi": {tenants: noisyTenants, configs: withTryOnce(oracleConfigs, 1), load: func(ctx context.Context, p *tenantdb.Pool, scans int, out *outcome, mu *sync.Mutex) error {
		var wg sync.WaitGroup
		start := time.Now()
		for _, tenant := range noisyTenants {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sendAtOnce(ctx, p, tenant, max(1, scans/len(noisyTenants)), scanSQL, out, mu, start)
			}()
		}
		wg.Wait()
		return nil
	}},
}

// withTryOnce returns configs with the try-once schedule from base before
// the last (adaptive) one.
func withTryOnce(configs []oracleConfig, base int) []oracleConfig {
	n := len(configs) - 1
	try := oracleConfig{name: fmt.Sprintf("try %d once", base+1), cap: base, tryOnce: true}
	return append(slices.Clip(configs[:n]), try, configs[n])
}

// runTryOnce runs the try-once schedule on the tenants of p until done is
// closed: each at base+1 from the end of its first query until the next
// ends, then at base. It reads the tenants' counts every millisecond.
func runTryOnce(p *tenantdb.Pool, tenants []string, base int, done <-chan struct{}) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	raisedAt := make(map[string]uint64) // completed queries when raised to base+1
	finished := make(map[string]bool)
	for {
		for _, id := range tenants {
			s := p.TenantStat(id)
			completed := s.Acquired - uint64(s.InUse)
			at, raised := raisedAt[id]
			switch {
			case finished[id]:
			case !raised && completed >= 1:
				if err := p.Gate().SetTenantLimit(id, base+1); err != nil {
					return err
				}
				raisedAt[id] = completed
			case raised && completed >= at+1:
				if err := p.Gate().SetTenantLimit(id, base); err != nil {
					return err
				}
				finished[id] = true
			}
		}
		select {
		case <-done:
			return nil
		case <-tick.C:
		}
	}
}

// oracleRun is one configuration's burst in one round.
type oracleRun struct {
	unloadedP50, p50, p99, makespan time.Duration
	medLimit                        int // the noisy tenants' median effective limit (the first tenant's), every 10 ms
	errors                          int
	trace                           *timeline // what the limits and the quiet tenant did, adaptive runs only
}

// runOracle is an oracle scenario: env.rounds rounds of every configuration
// in a rotated order on the named workload.
func runOracle(ctx context.Context, env *environment, name string) ([]result, error) {
	pg, err := env.cpuPostgres(ctx)
	if err != nil {
		return nil, err
	}
	w := oracleWorkloads[name]
	configs := w.limits()
	var rounds [][]oracleRun
	var scanAlone []time.Duration
	for round := range env.rounds {
		runs := make([]oracleRun, len(configs))
		var alone time.Duration
		for k := range configs {
			i := (round + k) % len(configs)
			c := configs[i]
			cfg, err := env.pgxConfig(pg.DSN, sharedConns)
			if err != nil {
				return nil, err
			}
			p, closePool, err := env.openTenantdb(ctx, cfg, tenantdb.Config{
				// Every tenant has the plan's cap of 10, but for the noisy
				// ones, whose cap is the configuration's.
				Plans: map[string]tenantdb.Plan{"standard": {MaxConns: perTenantCap, MaxWaiting: tenantdb.Unbounded}},
				Lookup: func(_ context.Context, id string) (tenantdb.Tenant, error) {
					if slices.Contains(noisyTenants, id) {
						return tenantdb.Tenant{Plan: "standard", MaxConns: c.cap}, nil
					}
					return tenantdb.Tenant{Plan: "standard"}, nil
				},
				Adaptive: tenantdb.Adaptive{Enabled: c.adaptive},
			})
			if err != nil {
				return nil, err
			}
			if k == 0 {
				// One scan alone, the fastest of three, sizes the round's bursts.
				for j := range 3 {
					t0 := time.Now()
					if _, err := p.Exec(tenantdb.WithTenant(ctx, "probe"), cpuNoisySQL, fmt.Sprint("probe", j)); err != nil {
						closePool()
						return nil, err
					}
					if d := time.Since(t0); alone == 0 || d < alone {
						alone = d
					}
				}
			}
			scans := max(12, min(90, int(oracleScanWork/max(alone, time.Millisecond))))
			progress("%s: round %d/%d, %s (%d scans a burst, one alone %v)", name, round+1, env.rounds, c.name, scans, alone.Round(time.Millisecond))
			var stop chan struct{}
			scheduled := make(chan error, 1)
			if c.tryOnce {
				stop = make(chan struct{})
				go func() { scheduled <- runTryOnce(p, w.tenants, c.cap, stop) }()
			}
			runs[i], err = oracleBurst(ctx, p, w, scans, c.adaptive)
			if stop != nil {
				close(stop)
				if serr := <-scheduled; err == nil {
					err = serr
				}
			}
			if s := p.Stat().Tenants; err == nil && (s.InUse != 0 || s.Waiting != 0) {
				err = fmt.Errorf("after the run %d slots are in use and %d waiting", s.InUse, s.Waiting)
			}
			closePool()
			if err != nil {
				return nil, err
			}
			if runs[i].trace != nil {
				runs[i].trace.Round = round + 1
			}
		}
		rounds = append(rounds, runs)
		scanAlone = append(scanAlone, alone)
	}
	if env.out != "" {
		// Written now, so that a run cut short keeps the workloads it finished.
		if err := writeTimelines(env.out, name, rounds); err != nil {
			return nil, err
		}
	}
	return oracleResults(name, rounds, scanAlone), nil
}

// oracleBurst measures the quiet tenant alone, then runs the noisy load with
// the quiet reads going on until it is done. With traced, it records every
// tenant's effective limit every 10 ms and when each quiet read completed.
func oracleBurst(ctx context.Context, p *tenantdb.Pool, w oracleWorkload, scans int, traced bool) (oracleRun, error) {
	alone := cpuReads(ctx, p, cpuUnloadedN/3, nil)
	before := p.TenantStat("quiet")
	var noisy outcome
	var mu sync.Mutex
	done := make(chan struct{})
	var loadErr error
	start := time.Now()
	go func() {
		defer close(done)
		loadErr = w.load(ctx, p, scans, &noisy, &mu)
	}()
	watched := append(slices.Clone(w.tenants), "quiet")
	sampled := make(chan []limitSample, 1)
	go func() {
		var ls []limitSample
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			at := time.Since(start)
			for j, tenant := range watched {
				if j > 0 && !traced {
					break // only the first noisy tenant's median is reported
				}
				ls = append(ls, limitSample{At: ms(at), Tenant: tenant, Limit: p.TenantStat(tenant).EffectiveLimit})
			}
			select {
			case <-done:
				sampled <- ls
				return
			case <-tick.C:
			}
		}
	}()
	quiet := cpuReads(ctx, p, 0, done)
	<-done
	makespan := time.Since(start)
	if after := p.TenantStat("quiet"); traced {
		progress("quiet tenant: %d reads, %v waiting for admission in all (its own limit, or the shared pool)", after.Acquired-before.Acquired, (after.WaitTime - before.WaitTime).Round(time.Microsecond))
	}
	samples := <-sampled
	var ls []int
	for _, s := range samples {
		if s.Tenant == w.tenants[0] {
			ls = append(ls, s.Limit)
		}
	}
	slices.Sort(ls)
	if loadErr != nil {
		return oracleRun{}, loadErr
	}
	if err := ctx.Err(); err != nil {
		return oracleRun{}, err
	}
	if noisy.errors+quiet.errors > 0 {
		first := noisy.firstErr
		if first == nil {
			first = quiet.firstErr
		}
		return oracleRun{}, fmt.Errorf("%d queries failed, first: %w", noisy.errors+quiet.errors, first)
	}
	run := oracleRun{unloadedP50: percentile(alone.latencies, 50), p50: percentile(quiet.latencies, 50),
		p99: percentile(quiet.latencies, 99), makespan: makespan, medLimit: ls[len(ls)/2]}
	if traced {
		run.trace = &timeline{Limits: samples, Makespan: ms(makespan)}
		for j, d := range quiet.latencies {
			run.trace.Quiet = append(run.trace.Quiet, quietSample{At: ms(quiet.ends[j]), Latency: ms(d)})
		}
		slices.SortFunc(run.trace.Quiet, func(a, b quietSample) int { return cmp.Compare(a.At, b.At) })
	}
	return run, nil
}

// oracleResults summarises the rounds of one oracle scenario as one row per
// configuration: medians over rounds of each metric and of its ratio to the
// round's best static cap, and the spread (each round's value).
func oracleResults(name string, rounds [][]oracleRun, scanAlone []time.Duration) []result {
	w := oracleWorkloads[name]
	configs := w.limits()
	metrics := []func(oracleRun) time.Duration{
		func(r oracleRun) time.Duration { return r.p50 },
		func(r oracleRun) time.Duration { return r.p99 },
		func(r oracleRun) time.Duration { return r.makespan },
	}
	best := func(runs []oracleRun, m func(oracleRun) time.Duration) time.Duration {
		b := m(runs[0])
		for j, r := range runs[:len(configs)-1] {
			if !configs[j].tryOnce {
				b = min(b, m(r))
			}
		}
		return b
	}
	var rs []result
	for i, c := range configs {
		row := result{Scenario: name, Tenant: c.name, Oracle: &oracleStats{Rounds: len(rounds)}}
		var ratios [3][]float64
		var vals [3][]float64
		var unloaded, limits, ideal []float64
		for _, runs := range rounds {
			for j, m := range metrics {
				ratios[j] = append(ratios[j], float64(m(runs[i]))/float64(best(runs, m)))
				vals[j] = append(vals[j], ms(m(runs[i])))
			}
			unloaded = append(unloaded, ms(runs[i].unloadedP50))
			limits = append(limits, float64(runs[i].medLimit))
			if w.ideal > 0 {
				ideal = append(ideal, float64(runs[i].makespan)/float64(w.ideal))
			}
		}
		row.P50, row.P99, row.Makespan = medianF(vals[0]), medianF(vals[1]), medianF(vals[2])
		o := row.Oracle
		o.P50Ratio, o.P99Ratio, o.MakespanRatio = medianF(ratios[0]), medianF(ratios[1]), medianF(ratios[2])
		o.P50Ratios, o.P99Ratios, o.MakespanRatios = ratios[0], ratios[1], ratios[2]
		o.P50s, o.P99s, o.Makespans = vals[0], vals[1], vals[2]
		o.UnloadedP50, o.EffectiveLimit = medianF(unloaded), medianF(limits)
		if w.ideal > 0 {
			o.IdealMakespan, o.IdealRatio, o.IdealRatios = ms(w.ideal), medianF(ideal), ideal
		}
		for _, d := range scanAlone {
			o.ScanAlone = append(o.ScanAlone, ms(d))
		}
		rs = append(rs, row)
	}
	return rs
}

// oracleStats are an oracle row's extra numbers: medians over rounds, and
// each round's ratio to the best static cap.
type oracleStats struct {
	Rounds         int       `json:"rounds"`
	UnloadedP50    float64   `json:"unloaded_p50_ms"`
	P50Ratio       float64   `json:"p50_ratio"`
	P99Ratio       float64   `json:"p99_ratio"`
	MakespanRatio  float64   `json:"makespan_ratio"`
	P50Ratios      []float64 `json:"p50_ratios"`
	P99Ratios      []float64 `json:"p99_ratios"`
	MakespanRatios []float64 `json:"makespan_ratios"`
	// P50s, P99s and Makespans are each round's values (ms): the spread.
	P50s      []float64 `json:"p50s_ms"`
	P99s      []float64 `json:"p99s_ms"`
	Makespans []float64 `json:"makespans_ms"`
	// IdealMakespan is the makespan no limit can beat (oracle-flood), and
	// IdealRatio the median of each round's makespan over it.
	IdealMakespan  float64   `json:"ideal_makespan_ms,omitempty"`
	IdealRatio     float64   `json:"ideal_ratio,omitempty"`
	IdealRatios    []float64 `json:"ideal_ratios,omitempty"`
	EffectiveLimit float64   `json:"effective_limit_median"`
	ScanAlone      []float64 `json:"scan_alone_ms"`
}

func medianF(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// oracleTable is the oracle scenarios' table: for every workload and limit,
// the quiet tenant's p50 and p99 and the noisy makespan, each with its ratio
// to the best static cap (medians over rounds), and the targets.
func oracleTable(rs []result) string {
	var b strings.Builder
	var names []string
	for _, r := range rs {
		if r.Oracle != nil && !slices.Contains(names, r.Scenario) {
			names = append(names, r.Scenario)
		}
	}
	if len(names) == 0 {
		return ""
	}
	fmt.Fprintf(&b, "\nAdaptive limits against the best static cap (oracle-*): PostgreSQL on one CPU; each round runs static caps 1, 2, 4, 10 "+
		"and adaptive (cap 10) on the same workload (oracle-flood: static 10 and adaptive; oracle-multi also \"try 2 once\" and oracle-turns \"try 3 once\", schedules that are not candidates for the best cap), in a rotated order, each on a fresh pool; the quiet tenant reads as in cpu-*. "+
		"Cells: median over rounds [min-max over rounds], and in brackets the median of each round's ratio to that round's best static cap [its min-max].\n\n")
	b.WriteString("| workload | limit | quiet alone p50 | quiet p50 | quiet p99 | noisy makespan | effective limit |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|\n")
	for _, name := range names {
		for _, r := range rs {
			if r.Scenario != name || r.Oracle == nil {
				continue
			}
			o := r.Oracle
			cell := func(v float64, vals []float64, ratio float64, ratios []float64) string {
				s := fmtDur(v)
				if len(vals) > 1 {
					s += fmt.Sprintf(" [%s-%s]", fmtDur(slices.Min(vals)), fmtDur(slices.Max(vals)))
				}
				r := fmt.Sprintf("%.2fx", ratio)
				if ratio == 1 {
					r = "**1.00x**"
				}
				if len(ratios) > 1 {
					r += fmt.Sprintf(" [%.2f-%.2f]", slices.Min(ratios), slices.Max(ratios))
				}
				return s + " (" + r + ")"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %g |\n", name, r.Tenant, fmtDur(o.UnloadedP50),
				cell(r.P50, o.P50s, o.P50Ratio, o.P50Ratios), cell(r.P99, o.P99s, o.P99Ratio, o.P99Ratios),
				cell(r.Makespan, o.Makespans, o.MakespanRatio, o.MakespanRatios), o.EffectiveLimit)
		}
	}
	fmt.Fprintf(&b, "\nTargets (medians over rounds; adaptive quiet p50 and noisy makespan within %.1fx of the best static cap, quiet p99 within %.1fx, "+
		"a pure-wait flood's makespan within %.1fx of its ideal):\n\n", oracleTarget, oracleTargetP99, oracleTargetIdeal)
	for _, name := range names {
		a, ok := find(rs, name, "adaptive")
		if !ok {
			continue
		}
		o := a.Oracle
		for _, m := range []struct {
			what  string
			ratio float64
			all   []float64
			goal  float64
		}{{"quiet p50", o.P50Ratio, o.P50Ratios, oracleTarget}, {"quiet p99", o.P99Ratio, o.P99Ratios, oracleTargetP99}, {"noisy makespan", o.MakespanRatio, o.MakespanRatios, oracleTarget}} {
			fmt.Fprintf(&b, "- %s: %s adaptive %s %.2fx the best static cap's (rounds: %s; goal ≤ %.1fx)\n", mark(m.ratio, m.goal), name, m.what, m.ratio, fmtRatios(m.all), m.goal)
		}
		if o.IdealMakespan > 0 {
			fmt.Fprintf(&b, "- %s: %s adaptive noisy makespan %.2fx the ideal %s (rounds: %s; goal ≤ %.1fx)\n",
				mark(o.IdealRatio, oracleTargetIdeal), name, o.IdealRatio, fmtDur(o.IdealMakespan), fmtRatios(o.IdealRatios), oracleTargetIdeal)
		}
	}
	return b.String()
}

func mark(ratio, goal float64) string {
	if ratio > goal {
		return "MISSED"
	}
	return "met"
}

func fmtRatios(xs []float64) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(parts, ", ")
}
