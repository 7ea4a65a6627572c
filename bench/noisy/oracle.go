package main

import (
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
// is in its numbers.

// oracleConfigs are the limits every oracle round runs; the last is the
// adaptive one.
var oracleConfigs = []struct {
	name     string
	cap      int
	adaptive bool
}{
	{"static 1", 1, false}, {"static 2", 2, false}, {"static 4", 4, false},
	{"static 10", perTenantCap, false}, {"adaptive", perTenantCap, true},
}

// oracleTarget is the goal for the adaptive limit's quiet p50, quiet p99 and
// noisy makespan: each within this factor of the best static cap's.
const oracleTarget = 1.2

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
func waitSQL(int) (string, []any) {
	return "select pg_sleep($1::float8) /* tenant=noisy */", []any{oracleSleep.Seconds()}
}

var oracleWorkloads = map[string]noisyLoad{
	// CPU-bound scans, all at once.
	"oracle-cpu": func(ctx context.Context, p *tenantdb.Pool, scans int, out *outcome, mu *sync.Mutex) error {
		sendAtOnce(ctx, p, "noisy", scans, scanSQL, out, mu, time.Now())
		return nil
	},
	// pg_sleep waits, all at once: no database CPU, the plan's cap is best.
	"oracle-sleep": func(ctx context.Context, p *tenantdb.Pool, _ int, out *outcome, mu *sync.Mutex) error {
		sendAtOnce(ctx, p, "noisy", oracleSleepN, waitSQL, out, mu, time.Now())
		return nil
	},
	// The noisy tenant alternates: a burst of scans, a burst of waits, then
	// scans and waits again, each half as large, one after the other on
	// the same pool, so the adaptive limit must follow the change.
	"oracle-mix": func(ctx context.Context, p *tenantdb.Pool, scans int, out *outcome, mu *sync.Mutex) error {
		start := time.Now()
		for range 2 {
			sendAtOnce(ctx, p, "noisy", max(1, scans/2), scanSQL, out, mu, start)
			sendAtOnce(ctx, p, "noisy", oracleMixSleeps, waitSQL, out, mu, start)
		}
		return nil
	},
	// Three noisy tenants at once, each with a third of the scans.
	"oracle-multi": func(ctx context.Context, p *tenantdb.Pool, scans int, out *outcome, mu *sync.Mutex) error {
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
	},
}

// oracleRun is one configuration's burst in one round.
type oracleRun struct {
	unloadedP50, p50, p99, makespan time.Duration
	medLimit                        int // the noisy tenants' median effective limit (the first tenant's), every 10 ms
	errors                          int
}

// runOracle is an oracle scenario: env.rounds rounds of every configuration
// in a rotated order on the named workload.
func runOracle(ctx context.Context, env *environment, name string) ([]result, error) {
	pg, err := env.cpuPostgres(ctx)
	if err != nil {
		return nil, err
	}
	load := oracleWorkloads[name]
	var rounds [][]oracleRun
	var scanAlone []time.Duration
	for round := range env.rounds {
		runs := make([]oracleRun, len(oracleConfigs))
		var alone time.Duration
		for k := range oracleConfigs {
			i := (round + k) % len(oracleConfigs)
			c := oracleConfigs[i]
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
			runs[i], err = oracleBurst(ctx, p, load, scans)
			if s := p.Stat().Tenants; err == nil && (s.InUse != 0 || s.Waiting != 0) {
				err = fmt.Errorf("after the run %d slots are in use and %d waiting", s.InUse, s.Waiting)
			}
			closePool()
			if err != nil {
				return nil, err
			}
		}
		rounds = append(rounds, runs)
		scanAlone = append(scanAlone, alone)
	}
	return oracleResults(name, rounds, scanAlone), nil
}

// oracleBurst measures the quiet tenant alone, then runs the noisy load with
// the quiet reads going on until it is done.
func oracleBurst(ctx context.Context, p *tenantdb.Pool, load noisyLoad, scans int) (oracleRun, error) {
	alone := cpuReads(ctx, p, cpuUnloadedN/3, nil)
	var noisy outcome
	var mu sync.Mutex
	done := make(chan struct{})
	var loadErr error
	start := time.Now()
	go func() {
		defer close(done)
		loadErr = load(ctx, p, scans, &noisy, &mu)
	}()
	limits := make(chan []int, 1)
	go func() {
		var ls []int
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			ls = append(ls, p.TenantStat(noisyTenants[0]).EffectiveLimit)
			select {
			case <-done:
				limits <- ls
				return
			case <-tick.C:
			}
		}
	}()
	quiet := cpuReads(ctx, p, 0, done)
	<-done
	makespan := time.Since(start)
	ls := <-limits
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
	return oracleRun{unloadedP50: percentile(alone.latencies, 50), p50: percentile(quiet.latencies, 50),
		p99: percentile(quiet.latencies, 99), makespan: makespan, medLimit: ls[len(ls)/2]}, nil
}

// oracleResults summarises the rounds of one oracle scenario as one row per
// configuration: medians over rounds of each metric and of its ratio to the
// round's best static cap.
func oracleResults(name string, rounds [][]oracleRun, scanAlone []time.Duration) []result {
	metrics := []func(oracleRun) time.Duration{
		func(r oracleRun) time.Duration { return r.p50 },
		func(r oracleRun) time.Duration { return r.p99 },
		func(r oracleRun) time.Duration { return r.makespan },
	}
	best := func(runs []oracleRun, m func(oracleRun) time.Duration) time.Duration {
		b := m(runs[0])
		for _, r := range runs[:len(oracleConfigs)-1] {
			b = min(b, m(r))
		}
		return b
	}
	var rs []result
	for i, c := range oracleConfigs {
		row := result{Scenario: name, Tenant: c.name, Oracle: &oracleStats{Rounds: len(rounds)}}
		var ratios [3][]float64
		var vals [3][]float64
		var unloaded, limits []float64
		for _, runs := range rounds {
			for j, m := range metrics {
				ratios[j] = append(ratios[j], float64(m(runs[i]))/float64(best(runs, m)))
				vals[j] = append(vals[j], ms(m(runs[i])))
			}
			unloaded = append(unloaded, ms(runs[i].unloadedP50))
			limits = append(limits, float64(runs[i].medLimit))
		}
		row.P50, row.P99, row.Makespan = medianF(vals[0]), medianF(vals[1]), medianF(vals[2])
		o := row.Oracle
		o.P50Ratio, o.P99Ratio, o.MakespanRatio = medianF(ratios[0]), medianF(ratios[1]), medianF(ratios[2])
		o.P50Ratios, o.P99Ratios, o.MakespanRatios = ratios[0], ratios[1], ratios[2]
		o.UnloadedP50, o.EffectiveLimit = medianF(unloaded), medianF(limits)
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
		"and adaptive (cap 10) on the same workload, in a rotated order, each on a fresh pool; the quiet tenant reads as in cpu-*. "+
		"Cells: median over rounds, and in brackets the median of each round's ratio to that round's best static cap.\n\n")
	b.WriteString("| workload | limit | quiet alone p50 | quiet p50 | quiet p99 | noisy makespan | effective limit |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|\n")
	for _, name := range names {
		for _, r := range rs {
			if r.Scenario != name || r.Oracle == nil {
				continue
			}
			o := r.Oracle
			cell := func(v, ratio float64) string {
				s := fmt.Sprintf("%s (%.2fx)", fmtDur(v), ratio)
				if ratio == 1 {
					s = fmt.Sprintf("%s (**1.00x**)", fmtDur(v))
				}
				return s
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %g |\n", name, r.Tenant, fmtDur(o.UnloadedP50),
				cell(r.P50, o.P50Ratio), cell(r.P99, o.P99Ratio), cell(r.Makespan, o.MakespanRatio), o.EffectiveLimit)
		}
	}
	fmt.Fprintf(&b, "\nTargets (adaptive within %.1fx of the best static cap, medians over rounds):\n\n", oracleTarget)
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
		}{{"quiet p50", o.P50Ratio, o.P50Ratios}, {"quiet p99", o.P99Ratio, o.P99Ratios}, {"noisy makespan", o.MakespanRatio, o.MakespanRatios}} {
			mark := "met"
			if m.ratio > oracleTarget {
				mark = "MISSED"
			}
			fmt.Fprintf(&b, "- %s: %s adaptive %s %.2fx the best static cap's (rounds: %s)\n", mark, name, m.what, m.ratio, fmtRatios(m.all))
		}
	}
	return b.String()
}

func fmtRatios(xs []float64) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(parts, ", ")
}
