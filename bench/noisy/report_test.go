package main

import (
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
