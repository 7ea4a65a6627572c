package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// Issue 27's experiment with durations scaled down: acme (cap 10) imports
// 200 statements of 200 ms while its users send 50 reads of 20 ms over a
// second; across tenants, five tenants' imports flood a saturated pool
// beside a sixth tenant's reads.
const (
	importStatements = 200
	importSleep      = 200 * time.Millisecond
	readQueries      = 50
	readSleep        = 20 * time.Millisecond
	readSpread       = time.Second
	acmeCap          = 10
	batchCap         = 6
)

// classConfig is acme's: interactive work on DESIGN.md's standard plan (a
// short bounded queue, so that a burst of arrivals on a loaded machine is not
// turned away), imports in the batch class.
func classConfig() tenantdb.Config {
	return tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"standard": {MaxConns: acmeCap, MaxWaiting: 5, MaxWait: 100 * time.Millisecond}},
		Classes: map[string]tenantdb.Class{
			"batch": {MaxConns: batchCap, MaxShare: 0.75, MaxWaiting: 1000, MaxWait: time.Minute},
		},
	}
}

// reads sends readQueries reads as tenant, spread over readSpread, and
// returns their latencies and how many failed with ErrOverLimit.
func reads(t *testing.T, db execer, tenant string) (lat []time.Duration, rejected int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range readQueries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := timed(db, tenant, readSleep)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				lat = append(lat, d)
			case errors.Is(err, tenantdb.ErrOverLimit):
				rejected++
			default:
				t.Errorf("read: %v", err)
			}
		}()
		if i < readQueries-1 {
			time.Sleep(readSpread / readQueries) // the arrival schedule, not synchronisation
		}
	}
	wg.Wait()
	return lat, rejected
}

// importFlood starts n statements of importSleep as tenant in ctx's class
// and returns a func that waits for them and reports how many succeeded.
func importFlood(t *testing.T, p *tenantdb.Pool, ctx context.Context, tenant string, n int) func() int {
	var ok atomic.Int64
	var wg sync.WaitGroup
	ctx = tenantdb.WithTenant(ctx, tenant)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.Exec(ctx, sleepSQL(tenant), importSleep.Seconds()); err != nil {
				t.Errorf("import of %s: %v", tenant, err)
				return
			}
			ok.Add(1)
		}()
	}
	return func() int { wg.Wait(); return int(ok.Load()) }
}

func TestImportDoesNotTakeDownItsOwnTenantsUsers(t *testing.T) {
	p, err := tenantdb.New(context.Background(), warmConfig(t), classConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitWarm(t, p.Pgxpool().Stat)
	reads(t, p, "acme") // the first statements on new backends are slower
	unloaded := unloadedReads(t, p, "acme")

	// The control: the same import without its class shares acme's cap with
	// its users, whose reads queue behind it (the plan queues here, so they
	// are not rejected).
	ctrl, err := tenantdb.New(context.Background(), warmConfig(t), tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"standard": {MaxConns: acmeCap, MaxWaiting: 1000, MaxWait: time.Minute}}})
	if err != nil {
		t.Fatal(err)
	}
	waitWarm(t, ctrl.Pgxpool().Stat)
	ctrlDone := importFlood(t, ctrl, context.Background(), "acme", importStatements/4)
	eventually(t, "the control import holds acme's cap", func() bool { return ctrl.TenantStat("acme").InUse == acmeCap })
	ctrlWaited := ctrl.TenantStat("acme").WaitTime
	ctrlLat, _ := reads(t, ctrl, "acme")
	ctrlWait := (ctrl.TenantStat("acme").WaitTime - ctrlWaited) / time.Duration(max(1, len(ctrlLat)))
	ctrlDone()
	ctrl.Close()
	if ctrlWait < readSleep/10 {
		t.Errorf("without a class the reads waited %v at the gate on average: readRounds' wait could not tell", ctrlWait)
	}

	done := importFlood(t, p, tenantdb.WithClass(context.Background(), "batch"), "acme", importStatements)
	ctrlRatio := float64(median(ctrlLat)) / float64(unloaded.p50)
	t.Logf("acme's reads: unloaded p50 %v; beside its import without a class %v (%.1fx), waiting %v at the gate on average", unloaded.p50, median(ctrlLat), ctrlRatio, ctrlWait)
	if ctrlRatio < 3 {
		t.Errorf("without a class the reads' p50 is only %.1fx unloaded: the import does not load acme", ctrlRatio)
	}
	within := readRounds(t, unloaded, func() bool {
		s := p.TenantStat("acme")
		return len(s.Classes) == 2 && s.Classes[1].InUse == batchCap && s.Classes[1].Waiting > 0
	}, func() ([]time.Duration, int) { return reads(t, p, "acme") },
		func() time.Duration { return p.TenantStat("acme").Classes[0].WaitTime })
	mostBatch := p.TenantStat("acme").Classes[1].InUse
	imported := done()
	if !within {
		t.Errorf("with the batch class acme's reads were held back beyond the unloaded reference in every round")
	}
	if imported != importStatements || mostBatch > batchCap {
		t.Errorf("%d of %d imported, batch held %d of its cap %d", imported, importStatements, mostBatch, batchCap)
	}
	assertNothingHeld(t, p)
}

func TestBatchFloodsOfFiveTenantsLeaveReadsAlone(t *testing.T) {
	p, err := tenantdb.New(context.Background(), warmConfig(t), classConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitWarm(t, p.Pgxpool().Stat)
	reads(t, p, "reader") // the first statements on new backends are slower
	unloaded := unloadedReads(t, p, "reader")

	// 5 tenants x 6 batch = 30 wanted of 20 shared: batch stops at its
	// share, 15, and the reads find free connections.
	batch := tenantdb.WithClass(context.Background(), "batch")
	const perTenant = 80
	var waits []func() int
	for i := range 5 {
		waits = append(waits, importFlood(t, p, batch, fmt.Sprintf("importer%d", i), perTenant))
	}
	const share = 15
	var samples, sum atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() { // what batch holds while it has requests waiting
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				if c := p.Stat().Tenants.Classes[1]; c.Waiting > 0 {
					samples.Add(1)
					sum.Add(int64(c.InUse))
				}
			}
		}
	}()
	within := readRounds(t, unloaded, func() bool {
		c := p.Stat().Tenants.Classes[1]
		return c.InUse == share && c.Waiting > 0
	}, func() ([]time.Duration, int) { return reads(t, p, "reader") },
		func() time.Duration { return p.TenantStat("reader").WaitTime })
	var done []int
	for _, w := range waits {
		done = append(done, w())
	}
	close(stop)
	<-sampled
	batchShare := float64(sum.Load()) / float64(samples.Load()) / float64(p.Gate().Capacity())
	t.Logf("batch share of the pool while it had waiters: %.2f over %d samples; imports done %v", batchShare, samples.Load(), done)
	if !within {
		t.Errorf("the reads beside the batch floods were held back beyond the unloaded reference in every round")
	}
	if batchShare < 0.6 || batchShare > 0.75 {
		t.Errorf("batch held %.2f of the pool on average, want near its MaxShare of 0.75 (neither starved nor above it)", batchShare)
	}
	for i, n := range done {
		if n != perTenant {
			t.Errorf("importer%d: %d of %d done", i, n, perTenant)
		}
	}
	assertNothingHeld(t, p)
}

// readStats is one round of reads: their p50, how many were rejected, and
// their mean wait at the gate.
type readStats struct {
	p50      time.Duration
	rejected int
	wait     time.Duration
}

// measureReads runs one round of reads and reads the tenant's wait at the
// gate from waited's total.
func measureReads(run func() ([]time.Duration, int), waited func() time.Duration) readStats {
	before := waited()
	lat, rejected := run()
	return readStats{p50: median(lat), rejected: rejected, wait: (waited() - before) / time.Duration(max(1, len(lat)+rejected))}
}

// unloadedReads is tenant's round of reads on p with nothing else running:
// the reference the rounds beside a flood are judged against.
func unloadedReads(t *testing.T, p *tenantdb.Pool, tenant string) readStats {
	t.Helper()
	r := measureReads(func() ([]time.Duration, int) { return reads(t, p, tenant) },
		func() time.Duration { return p.TenantStat(tenant).WaitTime })
	t.Logf("unloaded reads of %s: p50 %v, mean wait at the gate %v, %d rejected", tenant, r.p50, r.wait, r.rejected)
	return r
}

// readRounds runs up to three rounds of reads while loaded says the flood
// is at its peak, and reports whether in one the reads were not held back
// beyond the unloaded reference: no more rejected, and their p50 within
// 1.1x of it or (a machine busy from outside makes every statement slower,
// flood or not) their mean wait at the gate, from waited's total, within a
// tenth of a read's sleep of its wait. On a starved machine the reads'
// own plan queues and rejects them with no flood at all, which the
// reference shows. A round can be disturbed from outside (a burst of other
// processes delays the arrivals, so more reads overlap); without the class
// no round comes near (the control), so the best of three still fails when
// the mechanism does.
func readRounds(t *testing.T, unloaded readStats, loaded func() bool, run func() ([]time.Duration, int), waited func() time.Duration) bool {
	t.Helper()
	for round := 1; round <= 3; round++ {
		eventually(t, "the flood is at its peak", loaded)
		r := measureReads(run, waited)
		ratio := float64(r.p50) / float64(unloaded.p50)
		t.Logf("round %d: reads' p50 %v (%.2fx unloaded %v), mean wait at the gate %v (unloaded %v), %d rejected (unloaded %d)",
			round, r.p50, ratio, unloaded.p50, r.wait, unloaded.wait, r.rejected, unloaded.rejected)
		if r.rejected <= unloaded.rejected && (ratio <= 1.1 || r.wait < unloaded.wait+readSleep/10) {
			return true
		}
	}
	return false
}

func TestClassBadInput(t *testing.T) {
	// A class cap above a plan's cap, or a malformed name, fails New; an
	// unknown or malformed class fails the call and holds nothing.
	for _, tc := range []struct {
		cfg  tenantdb.Config
		want string
	}{
		{tenantdb.Config{Plans: map[string]tenantdb.Plan{"free": {MaxConns: 2}},
			Classes: map[string]tenantdb.Class{"batch": {MaxConns: 6}}}, `MaxConns 6 is above plan "free"'s MaxConns 2`},
		{tenantdb.Config{Classes: map[string]tenantdb.Class{"bulk load": {MaxConns: 1}}}, `class name "bulk load"`},
	} {
		_, err := tenantdb.New(context.Background(), pgxConfig(t, sharedPG, 10), tc.cfg)
		if !errors.Is(err, pool.ErrInvalidConfig) || !strings.Contains(errString(err), tc.want) {
			t.Errorf("New: err = %v, want ErrInvalidConfig saying %q", err, tc.want)
		}
	}
	p := newPool(t, sharedPG, 4, tenantdb.Config{Classes: map[string]tenantdb.Class{"batch": {MaxConns: 1}}})
	for _, name := range []string{"nope", "", "bad name"} {
		ctx := tenantdb.WithClass(as("acme"), name)
		if _, err := p.Exec(ctx, "select 1"); !errors.Is(err, tenantdb.ErrUnknownClass) {
			t.Errorf("class %q: err = %v, want ErrUnknownClass", name, err)
		}
	}
	if _, err := p.Exec(tenantdb.WithClass(as("acme"), "batch"), "select 1"); err != nil {
		t.Fatal(err)
	}
	assertNothingHeld(t, p)
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
