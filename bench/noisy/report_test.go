package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestPercentileIsNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    int
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {1, time.Millisecond}} {
		if got := percentile(ds, c.p); got != c.want {
			t.Errorf("p%d = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(ds[:1], 99); got != 100*time.Millisecond {
		t.Errorf("p99 of one sample = %v", got)
	}
}

func TestTargetsFlagWhatIsMissed(t *testing.T) {
	rows := []result{
		{Scenario: "queue", Tenant: "quiet", P50: 21, P99: 30},
		{Scenario: "queue", Tenant: "quiet-unloaded", P50: 20, P99: 24}, // p50 1.05x: met; p99 1.25x: missed
		{Scenario: "queue", Tenant: "noisy", Completed: 200, Makespan: 20_500},
		{Scenario: "reject", Tenant: "noisy", Completed: 10, Rejected: 190, MaxReject: 7}, // a slow rejection
	}
	got := targets(rows, 1)
	for _, want := range []string{
		"met: queue: quiet p50 1.05x",
		"MISSED: queue: quiet p99 1.25x",
		"met: queue: noisy completed 200/200",
		"MISSED: reject: 10 served, 190 rejected, slowest rejection 7.0 ms",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("targets lack %q:\n%s", want, got)
		}
	}
	table := markdownTable(rows, 1)
	if !strings.Contains(table, "| reject | noisy |") || !strings.Contains(table, "190 (each in ≤ 7.0 ms)") {
		t.Errorf("table:\n%s", table)
	}
}

// TestOracleRatios: each round's ratio is to that round's best static cap,
// per metric, and the table marks a target missed by its median.
func TestOracleRatios(t *testing.T) {
	ms := time.Millisecond
	run := func(p50, p99, makespan time.Duration) oracleRun {
		return oracleRun{unloadedP50: ms, p50: p50, p99: p99, makespan: makespan, medLimit: 1}
	}
	// static 1, 2, 4, 10, adaptive
	rounds := [][]oracleRun{
		{run(1*ms, 10*ms, 100*ms), run(2*ms, 8*ms, 90*ms), run(4*ms, 20*ms, 95*ms), run(8*ms, 40*ms, 99*ms), run(1*ms, 12*ms, 99*ms)},
		{run(2*ms, 20*ms, 200*ms), run(4*ms, 16*ms, 180*ms), run(8*ms, 40*ms, 190*ms), run(16*ms, 80*ms, 198*ms), run(3*ms, 16*ms, 180*ms)},
	}
	rs := oracleResults("oracle-cpu", rounds, []time.Duration{100 * ms, 100 * ms})
	a := rs[len(rs)-1]
	if a.Tenant != "adaptive" {
		t.Fatalf("last row %q, want adaptive", a.Tenant)
	}
	o := a.Oracle
	// p50: 1/1 and 3/2; p99: 12/8 and 16/16; makespan: 99/90 and 180/180.
	if o.P50Ratio != 1.25 || o.P99Ratio != 1.25 || math.Abs(o.MakespanRatio-1.05) > 1e-9 {
		t.Fatalf("ratios p50 %v p99 %v makespan %v, want 1.25, 1.25, 1.05", o.P50Ratio, o.P99Ratio, o.MakespanRatio)
	}
	table := oracleTable(rs)
	if !strings.Contains(table, "MISSED: oracle-cpu adaptive quiet p50 1.25x") || !strings.Contains(table, "met: oracle-cpu adaptive noisy makespan 1.05x") {
		t.Fatalf("table:\n%s", table)
	}
}
