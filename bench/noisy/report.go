package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// markdownTable is the results table: per scenario and tenant, latency
// percentiles, what completed and was rejected, and the makespan.
func markdownTable(rs []result, scale float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nNoisy tenant: 200 queries of %s at once; quiet tenant: 50 queries of %s spread over %s (scale %g).\n\n",
		fmtDur(1000*scale), fmtDur(20*scale), fmtDur(1000*scale), scale)
	for _, r := range rs {
		if strings.HasPrefix(r.Scenario, "cpu-") {
			fmt.Fprintf(&b, "CPU-bound scenarios (cpu-*, not scaled): PostgreSQL confined to one CPU; noisy tenant: %d scans computing md5 "+
				"over 300,000 rows at once; quiet tenant: a 200-row key-range read every %v while they run.\n\n", cpuNoisyN, cpuQuietPace)
			break
		}
	}
	for _, r := range rs {
		if strings.HasPrefix(r.Scenario, "http-") {
			b.WriteString("HTTP scenarios (http-*): the same workload as HTTP requests from a real client over loopback, " +
				"through poolhttp.Middleware to a handler that sleeps for the request's duration (no database); " +
				"a rejection is a 429 with a valid Retry-After. http-shared puts every request in one bucket of 20.\n\n")
			break
		}
	}
	b.WriteString("| scenario | tenant | p50 | p99 | max | completed | rejected | makespan |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		if strings.HasPrefix(r.Tenant, "select-1") || r.Oracle != nil {
			continue
		}
		rejected := fmt.Sprint(r.Rejected)
		switch {
		case r.Rejected > 0 && r.MaxRejectServer > 0:
			rejected += fmt.Sprintf(" 429s (each in ≤ %s in the server, p99 %s; ≤ %s at the client)",
				fmtDur(r.MaxRejectServer), fmtDur(r.P99RejectServer), fmtDur(r.MaxReject))
		case r.Rejected > 0:
			rejected += fmt.Sprintf(" (each in ≤ %s)", fmtDur(r.MaxReject))
		}
		if r.Errors > 0 {
			rejected += fmt.Sprintf(", %d errors: %s", r.Errors, r.FirstError)
		}
		if r.MostBatch > 0 {
			rejected += fmt.Sprintf(" (batch held at most %d; %.2f of the pool on average while it had waiters)", r.MostBatch, r.BatchShare)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %d | %s | %s |\n",
			r.Scenario, r.Tenant, fmtDur(r.P50), fmtDur(r.P99), fmtDur(r.Max), r.Completed, rejected, fmtDur(r.Makespan))
	}
	for _, r := range rs {
		if r.Tenant == "select-1-direct" {
			for _, p := range rs {
				if p.Scenario == r.Scenario && p.Tenant == "select-1-pgbouncer" {
					fmt.Fprintf(&b, "\nThe extra hop: `select 1` takes %.3f ms direct and %.3f ms through PgBouncer (median of %d, simple protocol).\n",
						r.P50, p.P50, r.Completed)
				}
			}
		}
	}
	return b.String()
}

func fmtDur(ms float64) string {
	switch {
	case ms == 0:
		return "–"
	case ms < 1:
		return fmt.Sprintf("%.2f ms", ms)
	case ms < 100:
		return fmt.Sprintf("%.1f ms", ms)
	default:
		return fmt.Sprintf("%s ms", commas(int64(ms+0.5)))
	}
}

func commas(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func find(rs []result, scenario, tenant string) (result, bool) {
	for _, r := range rs {
		if r.Scenario == scenario && r.Tenant == tenant {
			return r, true
		}
	}
	return result{}, false
}

// targetLine is one line of targets: a check of a goal (met or missed) or,
// with check false, a measurement shown for comparison.
type targetLine struct {
	scenario  string
	check, ok bool
	text      string
}

// guideScenarios are the rows of the guide's table that the default run
// shows; a missed target among them fails the run (guideMissed).
var guideScenarios = []string{"shared", "queue", "reject", "fair"}

// targets checks the run against the goals the project set itself, with
// ratios measured in this run.
func targets(rs []result, scale float64) string {
	var b strings.Builder
	b.WriteString("\nTargets (ratios against the quiet tenant's unloaded latency measured just before each flood):\n\n")
	for _, l := range targetLines(rs, scale) {
		switch {
		case !l.check:
			fmt.Fprintf(&b, "- %s\n", l.text)
		case l.ok:
			fmt.Fprintf(&b, "- met: %s\n", l.text)
		default:
			fmt.Fprintf(&b, "- MISSED: %s\n", l.text)
		}
	}
	return b.String()
}

// guideMissed lists the missed targets of the guide's rows (guideScenarios).
func guideMissed(rs []result, scale float64) []string {
	var missed []string
	for _, l := range targetLines(rs, scale) {
		if l.check && !l.ok && slices.Contains(guideScenarios, l.scenario) {
			missed = append(missed, l.text)
		}
	}
	return missed
}

func targetLines(rs []result, scale float64) []targetLine {
	var ls []targetLine
	check := func(sc string, ok bool, format string, args ...any) {
		ls = append(ls, targetLine{scenario: sc, check: true, ok: ok, text: fmt.Sprintf(format, args...)})
	}
	info := func(sc, format string, args ...any) {
		ls = append(ls, targetLine{scenario: sc, text: fmt.Sprintf(format, args...)})
	}
	if q, ok := find(rs, "shared", "quiet"); ok {
		u, _ := find(rs, "shared", "quiet-unloaded")
		check("shared", u.P50 > 0 && q.P50 >= 10*u.P50,
			"shared: quiet p50 %s, %.0fx unloaded (target ≥ 10x: the shared limit alone couples the tenants; about 9.5 s at scale 1, the guide's 9,558 ms)",
			fmtDur(q.P50), q.P50/max(u.P50, 1e-9))
	}
	for _, sc := range []string{"queue", "reject", "fair", "queue-adaptive", "reject-adaptive", "fair-adaptive", "http-queue", "http-reject"} {
		q, ok1 := find(rs, sc, "quiet")
		u, ok2 := find(rs, sc, "quiet-unloaded")
		if !ok1 || !ok2 || u.P50 == 0 {
			continue
		}
		check(sc, q.P50 <= 1.05*u.P50, "%s: quiet p50 %.2fx unloaded (target ≤ 1.05x)", sc, q.P50/u.P50)
		check(sc, q.P99 <= 1.2*u.P99, "%s: quiet p99 %.2fx unloaded (target ≤ 1.2x)", sc, q.P99/u.P99)
	}
	if q, ok := find(rs, "http-shared", "quiet"); ok {
		info("http-shared", "http-shared: quiet p50 %s (the guide: 9,558 ms at scale 1)", fmtDur(q.P50))
	}
	if n, ok := find(rs, "http-queue", "noisy"); ok {
		ideal := 200 * 1000 * scale / perTenantCap
		check("http-queue", n.Completed == 200 && n.Makespan <= 1.1*ideal,
			"http-queue: noisy completed %d/200 in %s, %.3fx the ideal %s (target all, ≤ 1.1x)", n.Completed, fmtDur(n.Makespan), n.Makespan/ideal, fmtDur(ideal))
	}
	if n, ok := find(rs, "http-reject", "noisy"); ok {
		check("http-reject", n.Completed == perTenantCap && n.Rejected == 200-perTenantCap && n.Errors == 0 && n.MaxRejectServer <= 5,
			"http-reject: %d served, %d answered 429 with Retry-After, slowest 429 %s in the server (target 10, 190, ≤ 5 ms; p99 %s); %s at the client",
			n.Completed, n.Rejected, fmtDur(n.MaxRejectServer), fmtDur(n.P99RejectServer), fmtDur(n.MaxReject))
	}
	if n, ok := find(rs, "queue", "noisy"); ok {
		ideal := 200 * 1000 * scale / perTenantCap
		check("queue", n.Completed == 200 && n.Makespan <= 1.1*ideal,
			"queue: noisy completed %d/200 in %s, %.3fx the ideal %s (target all, ≤ 1.1x)", n.Completed, fmtDur(n.Makespan), n.Makespan/ideal, fmtDur(ideal))
	}
	if n, ok := find(rs, "queue-adaptive", "noisy"); ok {
		ideal := 200 * 1000 * scale / perTenantCap
		check("queue-adaptive", n.Completed == 200 && n.Makespan <= 1.15*ideal,
			"queue-adaptive: noisy completed %d/200 in %s, %.3fx the ideal %s (target all, ≤ 1.15x)", n.Completed, fmtDur(n.Makespan), n.Makespan/ideal, fmtDur(ideal))
	}
	for _, sc := range []string{"cpu-static10", "cpu-static2", "cpu-adaptive"} {
		q, ok1 := find(rs, sc, "quiet")
		u, ok2 := find(rs, sc, "quiet-unloaded")
		n, _ := find(rs, sc, "noisy")
		if !ok1 || !ok2 || u.P50 == 0 {
			continue
		}
		// No absolute target: what a quiet read can reach next to a scan
		// depends on the machine; the oracle-cpu scenario judges adaptive
		// limits against the best static cap measured in the same run.
		text := fmt.Sprintf("%s: quiet p50 %.2fx unloaded, p99 %.1fx unloaded p50; noisy %d/%d in %s",
			sc, q.P50/u.P50, q.P99/u.P50, n.Completed, cpuNoisyN, fmtDur(n.Makespan))
		if s, ok := find(rs, "cpu-static10", "noisy"); ok && sc != "cpu-static10" && s.Makespan > 0 {
			text += fmt.Sprintf(" (%.2fx static cap 10's)", n.Makespan/s.Makespan)
		}
		info(sc, "%s", text)
	}
	for _, sc := range []string{"reject", "reject-adaptive"} {
		n, ok := find(rs, sc, "noisy")
		if !ok {
			continue
		}
		check(sc, n.Completed == perTenantCap && n.Rejected == 200-perTenantCap && n.MaxReject <= 5,
			"%s: %d served, %d rejected, slowest rejection %s (target 10, 190, ≤ 5 ms)", sc, n.Completed, n.Rejected, fmtDur(n.MaxReject))
	}
	if f, ok := find(rs, "fair-adaptive", "noisy"); ok {
		if s, ok := find(rs, "fair", "noisy"); ok {
			info("fair-adaptive", "fair-adaptive: noisy's makespan %s, %.3fx fair's %s (slow start to its cap of 20)",
				fmtDur(f.Makespan), f.Makespan/s.Makespan, fmtDur(s.Makespan))
		}
	}
	if f, ok := find(rs, "fair", "noisy"); ok {
		if q, ok := find(rs, "queue", "noisy"); ok && q.Makespan > 0 {
			check("fair", f.Completed == 200 && f.Makespan < q.Makespan,
				"fair: noisy completed %d/200 in %s, %.2fx queue's %s with a fixed cap of 10 (target all, < 1x: it uses the capacity the quiet tenant leaves idle)",
				f.Completed, fmtDur(f.Makespan), f.Makespan/q.Makespan, fmtDur(q.Makespan))
		}
		fq, _ := find(rs, "fair", "quiet")
		text := fmt.Sprintf("fair: quiet p50 %s / max %s with its reservation of 4", fmtDur(fq.P50), fmtDur(fq.Max))
		if nq, ok := find(rs, "fair-noreserve", "quiet"); ok {
			text += fmt.Sprintf("; %s / %s without it", fmtDur(nq.P50), fmtDur(nq.Max))
		}
		info("fair", "%s", text)
	}
	return ls
}

// writeReport writes the table (noisy.md), the rows (results.json) and a
// chart of the quiet tenant's p50 per scenario (quiet_p50.png) to dir.
func writeReport(dir string, rs []result, scale float64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	md := "# Noisy neighbour: results\n\nProduced by `go run ./bench/noisy" + scenariosFlag(rs) + scaleFlag(scale) + roundsFlag(rs) + " -out " + dir + "`.\n"
	if !onlyOracle(rs) {
		md += markdownTable(rs, scale) + targets(rs, scale)
	}
	md += oracleTable(rs)
	if !onlyOracle(rs) {
		md += "\n![quiet tenant p50 per scenario](quiet_p50.png)\n"
	}
	for _, name := range oracleNames(rs) {
		md += fmt.Sprintf("\n![%s: effective limits and quiet reads of the adaptive runs](timeline-%s.png) (data: [timeline-%s.csv](timeline-%s.csv))\n", name, name, name, name)
	}
	if err := os.WriteFile(filepath.Join(dir, "noisy.md"), []byte(md), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rs, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	return chart(filepath.Join(dir, "quiet_p50.png"), rs, scale)
}

// scenariosFlag is the -scenarios flag that selects the scenarios of rs,
// empty when they are the default ones.
func scenariosFlag(rs []result) string {
	var names []string
	for _, r := range rs {
		if !slices.Contains(names, r.Scenario) {
			names = append(names, r.Scenario)
		}
	}
	switch {
	case len(names) == len(scenarios):
		return " -scenarios all"
	case slices.Equal(names, defaultScenarios):
		return ""
	}
	return " -scenarios " + strings.Join(names, ",")
}

// roundsFlag is the -rounds flag of a run with oracle-* scenarios.
func roundsFlag(rs []result) string {
	for _, r := range rs {
		if r.Oracle != nil {
			return fmt.Sprintf(" -rounds %d", r.Oracle.Rounds)
		}
	}
	return ""
}

// onlyOracle reports whether rs holds only oracle-* rows, which the
// flood's table, targets and chart do not show.
func onlyOracle(rs []result) bool {
	for _, r := range rs {
		if r.Oracle == nil {
			return false
		}
	}
	return true
}

// oracleNames are the oracle-* scenarios of rs, in order.
func oracleNames(rs []result) []string {
	var names []string
	for _, r := range rs {
		if r.Oracle != nil && !slices.Contains(names, r.Scenario) {
			names = append(names, r.Scenario)
		}
	}
	return names
}

func scaleFlag(scale float64) string {
	if scale == 1 {
		return ""
	}
	return fmt.Sprintf(" -scale %g", scale)
}

// chart draws the quiet tenant's p50 per scenario, unloaded next to loaded,
// on a log scale: the shared pool's seconds and the bulkheads' milliseconds
// do not fit one linear axis.
func chart(path string, rs []result, scale float64) error {
	var names []string
	var loaded, unloaded plotter.Values
	for _, r := range rs {
		if r.Tenant != "quiet" {
			continue
		}
		u, _ := find(rs, r.Scenario, "quiet-unloaded")
		names = append(names, r.Scenario)
		loaded = append(loaded, max(r.P50, 0.1))
		unloaded = append(unloaded, max(u.P50, 0.1))
	}
	if len(names) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Quiet tenant p50 while a noisy tenant floods (scale %g)", scale)
	p.Y.Label.Text = "p50 latency (ms, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	// Bars start at zero, which a log axis cannot show: each bar stands on
	// an undrawn base just below the smallest value, and is that much shorter.
	floor := min(slicesMin(loaded), slicesMin(unloaded)) / 2
	bars := func(vs plotter.Values, c color.Color, offset vg.Length) (*plotter.BarChart, error) {
		base := make(plotter.Values, len(vs))
		above := make(plotter.Values, len(vs))
		for i, v := range vs {
			base[i], above[i] = floor, v-floor
		}
		w := vg.Points(18)
		under, err := plotter.NewBarChart(base, w)
		if err != nil {
			return nil, err
		}
		bc, err := plotter.NewBarChart(above, w)
		if err != nil {
			return nil, err
		}
		under.Offset = offset * w
		bc.StackOn(under)
		bc.Color = c
		return bc, nil
	}
	bu, err := bars(unloaded, color.Gray{Y: 170}, -0.5)
	if err != nil {
		return err
	}
	bl, err := bars(loaded, plotutil.Color(0), 0.5)
	if err != nil {
		return err
	}
	p.Add(bu, bl)
	// Label the bars measured during the flood (the table has the rest):
	// labels on both bars of a pair would overlap.
	for _, s := range []struct {
		vs     plotter.Values
		offset float64
	}{{loaded, 0.5}} {
		xys := plotter.XYLabels{XYs: make(plotter.XYs, len(s.vs)), Labels: make([]string, len(s.vs))}
		for i, v := range s.vs {
			xys.XYs[i] = plotter.XY{X: float64(i), Y: v * 1.15}
			xys.Labels[i] = fmtDur(v)
		}
		labels, err := plotter.NewLabels(xys)
		if err != nil {
			return err
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i].Font.Size = vg.Points(7)
		}
		labels.Offset.X = vg.Points(18*s.offset) - vg.Points(9)
		p.Add(labels)
	}
	p.Legend.Add("quiet alone", bu)
	p.Legend.Add("during the flood", bl)
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(10)
	p.NominalX(names...)
	// About 0.85 inch per pair of bars, so that the scenario names do not run together.
	return p.Save(max(8*vg.Inch, vg.Length(len(names))*0.85*vg.Inch), 4*vg.Inch, path)
}

func slicesMin(vs plotter.Values) float64 {
	m := vs[0]
	for _, v := range vs {
		m = min(m, v)
	}
	return m
}
