package main

import (
	"bufio"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// timeline is what the adaptive controller did in one oracle burst: every
// watched tenant's effective limit every 10 ms, and each quiet read by
// when it completed. Times are ms from the start of the burst.
type timeline struct {
	Round    int
	Makespan float64
	Limits   []limitSample
	Quiet    []quietSample
}

type limitSample struct {
	At     float64
	Tenant string
	Limit  int
}

type quietSample struct{ At, Latency float64 }

// writeTimelines writes the adaptive runs' timelines of one oracle workload
// to dir as timeline-NAME.csv (one row a sample; a tenant's limit only where
// it changed, and at the end) and timeline-NAME.png (a row per round: the
// limits, and the quiet reads' latency beside the round's best static cap's
// quiet p50 and p99).
func writeTimelines(dir, name string, rounds [][]oracleRun) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "timeline-"+name+".csv"))
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "round,t_ms,series,tenant,value")
	var traces []*timeline
	for _, runs := range rounds {
		tr := runs[len(runs)-1].trace
		if tr == nil {
			continue
		}
		traces = append(traces, tr)
		last := map[string]int{}
		for i, s := range tr.Limits {
			prev, seen := last[s.Tenant]
			if !seen || prev != s.Limit || i >= len(tr.Limits)-len(last) {
				fmt.Fprintf(w, "%d,%.1f,effective_limit,%s,%d\n", tr.Round, s.At, s.Tenant, s.Limit)
			}
			last[s.Tenant] = s.Limit
		}
		for _, q := range tr.Quiet {
			fmt.Fprintf(w, "%d,%.1f,quiet_latency_ms,quiet,%.3f\n", tr.Round, q.At, q.Latency)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if len(traces) == 0 {
		return nil
	}
	return timelinePlot(filepath.Join(dir, "timeline-"+name+".png"), name, traces, rounds)
}

// timelinePlot draws one row per round: the effective limits over time on
// the left, the quiet reads' latency (log scale) on the right.
func timelinePlot(path, name string, traces []*timeline, rounds [][]oracleRun) error {
	plots := make([][]*plot.Plot, len(traces))
	for r, tr := range traces {
		lp := plot.New()
		lp.Title.Text = fmt.Sprintf("%s, round %d: effective limits (adaptive, cap 10)", name, tr.Round)
		lp.X.Label.Text = "ms since the burst began"
		lp.Y.Label.Text = "effective limit"
		lp.Y.Min, lp.Y.Max = 0, perTenantCap+0.5
		var tenants []string
		for _, s := range tr.Limits {
			if !slices.Contains(tenants, s.Tenant) {
				tenants = append(tenants, s.Tenant)
			}
		}
		for i, tenant := range tenants {
			var xys plotter.XYs
			for _, s := range tr.Limits {
				if s.Tenant == tenant {
					xys = append(xys, plotter.XY{X: s.At, Y: float64(s.Limit)})
				}
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return err
			}
			l.StepStyle = plotter.PostStep
			l.Color = plotutil.Color(i)
			l.Width = vg.Points(1.2)
			if tenant == "quiet" {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			}
			lp.Add(l)
			lp.Legend.Add(tenant, l)
		}
		lp.Legend.Top = true

		qp := plot.New()
		qp.Title.Text = fmt.Sprintf("%s, round %d: quiet reads (adaptive)", name, tr.Round)
		qp.X.Label.Text = "ms since the burst began (read completed)"
		qp.Y.Label.Text = "latency (ms, log scale)"
		qp.Y.Scale = plot.LogScale{}
		qp.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		var xys plotter.XYs
		for _, q := range tr.Quiet {
			xys = append(xys, plotter.XY{X: q.At, Y: max(q.Latency, 0.01)})
		}
		if len(xys) > 0 {
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return err
			}
			sc.GlyphStyle.Radius = vg.Points(1)
			sc.GlyphStyle.Color = color.RGBA{R: 30, G: 90, B: 200, A: 160}
			qp.Add(sc)
			qp.Legend.Add("quiet read", sc)
		}
		// The round's best static cap's quiet p50 and p99, for reference.
		runs := rounds[tr.Round-1]
		bestP50, bestP99 := runs[0].p50, runs[0].p99
		for _, run := range runs[:len(runs)-1] {
			bestP50, bestP99 = min(bestP50, run.p50), min(bestP99, run.p99)
		}
		for i, ref := range []struct {
			label string
			v     float64
		}{{"best static p50", ms(bestP50)}, {"best static p99", ms(bestP99)}} {
			if ref.v <= 0 {
				continue
			}
			l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: ref.v}, {X: tr.Makespan, Y: ref.v}})
			if err != nil {
				return err
			}
			l.Color = color.Gray{Y: uint8(60 + 60*i)}
			l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
			qp.Add(l)
			qp.Legend.Add(ref.label, l)
		}
		qp.Legend.Top = true
		plots[r] = []*plot.Plot{lp, qp}
	}
	width, height := 13*vg.Inch, vg.Length(len(traces))*3.2*vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	t := draw.Tiles{Rows: len(traces), Cols: 2, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, t, dc)
	for j := range plots {
		for i := range plots[j] {
			plots[j][i].Draw(canvases[j][i])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
