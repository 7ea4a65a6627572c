package tenantdb_test

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// The CPU-bound tests judge the adaptive limit against static caps on the
// one core the database runs on (startCPUPostgres). Work from outside (a
// build, another test run, a busy loop) on that core slows each run by how
// the kernel happens to share it, not by the caps: coreSample measures that
// work, so that a round it disturbed is told apart from a miss.

// cpuCore is the core startCPUPostgres confines the database to.
const cpuCore = "cpu1"

// userHZ is the unit of /proc/stat's times on Linux.
const userHZ = 100

// coreShared is the share of a round's wall time above which work of
// neither the database nor the test ran on the database's core: the round
// is judged disturbed. On an idle machine the share is a few percent.
const coreShared = 0.2

// coreSample is what the database's core had run up to a moment: its busy
// time (every process's, from /proc/stat), the database container's CPU time
// (from its cgroup) and this test process's (on any core), the first two
// read through the database itself as the superuser.
type coreSample struct {
	at                    time.Time
	busy, container, self time.Duration
	ok                    bool // false where a file could not be read: nothing is judged
}

func sampleCore(t *testing.T, pg *tenantdbtest.Postgres) coreSample {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var stat string
	var v1, v2 *string
	err = c.QueryRow(ctx, `select pg_catalog.pg_read_file('/proc/stat'),
		pg_catalog.pg_read_file('/sys/fs/cgroup/cpuacct/cpuacct.usage', 0, 100, true),
		pg_catalog.pg_read_file('/sys/fs/cgroup/cpu.stat', 0, 2000, true)`).Scan(&stat, &v1, &v2)
	s := coreSample{at: time.Now()}
	if err != nil {
		t.Logf("core sample: %v: rounds are judged without it", err)
		return s
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return s
	}
	s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	var busyOK, containerOK bool
	s.busy, busyOK = coreBusy(stat)
	s.container, containerOK = cgroupUsage(v1, v2)
	s.ok = busyOK && containerOK
	return s
}

// coreBusy is cpuCore's busy time in /proc/stat's text: user, nice,
// system, irq, softirq and steal.
func coreBusy(stat string) (time.Duration, bool) {
	for line := range strings.Lines(stat) {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != cpuCore {
			continue
		}
		var ticks int64
		for _, i := range []int{1, 2, 3, 6, 7, 8} {
			n, err := strconv.ParseInt(f[i], 10, 64)
			if err != nil {
				return 0, false
			}
			ticks += n
		}
		return time.Duration(ticks) * time.Second / userHZ, true
	}
	return 0, false
}

// cgroupUsage is the container's CPU time from cgroup v1's cpuacct.usage
// (nanoseconds) or v2's cpu.stat (usage_usec), whichever was readable.
func cgroupUsage(v1, v2 *string) (time.Duration, bool) {
	if v1 != nil {
		n, err := strconv.ParseInt(strings.TrimSpace(*v1), 10, 64)
		return time.Duration(n), err == nil
	}
	if v2 != nil {
		for line := range strings.Lines(*v2) {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "usage_usec" {
				n, err := strconv.ParseInt(f[1], 10, 64)
				return time.Duration(n) * time.Microsecond, err == nil
			}
		}
	}
	return 0, false
}

// outsideShare is the share of the wall time from a to b in which the
// database's core ran work of neither the database nor this test (all of
// whose CPU time, on any core, is counted as if on that one, so the share is
// never overstated); ok is false when it could not be measured.
func outsideShare(a, b coreSample) (float64, bool) {
	wall := b.at.Sub(a.at)
	if !a.ok || !b.ok || wall <= 0 {
		return 0, false
	}
	outside := (b.busy - a.busy) - (b.container - a.container) - (b.self - a.self)
	return max(0, float64(outside)/float64(wall)), true
}
