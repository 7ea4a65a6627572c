package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// The seed's experiment, scaled down: a noisy tenant floods with slow
// queries, a quiet tenant sends fast ones spread over a short window.
const (
	noisyQueries = 40
	noisySleep   = 250 * time.Millisecond
	quietQueries = 12
	quietSleep   = 30 * time.Millisecond
	quietSpread  = 300 * time.Millisecond
	sharedConns  = 20
	perTenantCap = 10
)

// execer is what both a raw pgxpool and a tenantdb.Pool offer.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func sleepSQL(tenant string) string {
	return fmt.Sprintf("select pg_sleep($1::float8) /* tenant=%s */", tenant)
}

// timed runs one query as tenant and returns how long it took.
func timed(db execer, tenant string, sleep time.Duration) (time.Duration, error) {
	start := time.Now()
	_, err := db.Exec(tenantdb.WithTenant(context.Background(), tenant), sleepSQL(tenant), sleep.Seconds())
	return time.Since(start), err
}

// unloadedMedian is the quiet tenant's median with nobody else around.
func unloadedMedian(t *testing.T, db execer) time.Duration {
	t.Helper()
	var ds []time.Duration
	for range quietQueries {
		d, err := timed(db, "quiet", quietSleep)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	return median(ds)
}

type floodResult struct {
	quiet          []time.Duration
	noisyOK        int
	noisyRejected  []time.Duration // how long each rejection took
	noisyServed    []time.Duration
	maxNoisyActive int
}

// flood runs the noisy burst and the quiet trickle at once, sampling
// pg_stat_activity for the noisy tenant's active backends meanwhile.
func flood(t *testing.T, db execer) floodResult {
	t.Helper()
	sampler := startActivitySampler(t, "tenant=noisy ")
	var r floodResult
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range noisyQueries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d, err := timed(db, "noisy", noisySleep)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				r.noisyOK++
				r.noisyServed = append(r.noisyServed, d)
			case errors.Is(err, tenantdb.ErrOverLimit):
				r.noisyRejected = append(r.noisyRejected, d)
			default:
				t.Errorf("noisy: %v", err)
			}
		}()
	}
	close(start)
	// Let the burst take its connections, then trickle the quiet queries.
	eventually(t, "the noisy burst is running", func() bool { return sampler.current() > 0 })
	for i := range quietQueries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := timed(db, "quiet", quietSleep)
			if err != nil {
				t.Errorf("quiet: %v", err)
				return
			}
			mu.Lock()
			r.quiet = append(r.quiet, d)
			mu.Unlock()
		}()
		if i < quietQueries-1 {
			time.Sleep(quietSpread / quietQueries) // the arrival schedule, not synchronisation
		}
	}
	wg.Wait()
	r.maxNoisyActive = sampler.stop()
	return r
}

// quietWaits measures, over a flood, the quiet tenant's wait at tenantdb's
// gate and how many acquires waited for a connection of the shared pool.
// A quiet median that a starved machine inflates, while the quiet queries
// waited for neither, was not held back by the noisy tenant.
type quietWaits struct {
	p     *tenantdb.Pool
	wait  time.Duration
	empty int64
}

func startQuietWaits(p *tenantdb.Pool) *quietWaits {
	return &quietWaits{p: p, wait: p.TenantStat("quiet").WaitTime, empty: p.Pgxpool().Stat().EmptyAcquireCount()}
}

// end returns the quiet tenant's mean wait at the gate over its n queries
// and the acquires that waited for a connection since the start.
func (w *quietWaits) end(n int) (time.Duration, int64) {
	return (w.p.TenantStat("quiet").WaitTime - w.wait) / time.Duration(max(1, n)), w.p.Pgxpool().Stat().EmptyAcquireCount() - w.empty
}

// heldBack reports whether the quiet queries waited for something: at the
// gate for more than a tenth of their sleep on average, or for a
// connection.
func (w *quietWaits) heldBack(wait time.Duration, empty int64) bool {
	return wait > quietSleep/10 || empty > 0
}

// warm opens every connection of a pool up front, so that connection set-up
// is not mistaken for queueing.
func warmConfig(t *testing.T) *pgxpool.Config {
	cfg := pgxConfig(t, sharedPG, sharedConns)
	cfg.MinConns = sharedConns
	return cfg
}

func waitWarm(t *testing.T, stat func() *pgxpool.Stat) {
	t.Helper()
	eventually(t, "every connection is open", func() bool { return stat().TotalConns() == sharedConns })
}

func TestSlowQueryIsolation(t *testing.T) {
	// Behind a raw pgxpool the quiet tenant queues behind the noisy burst.
	raw, err := pgxpool.NewWithConfig(context.Background(), warmConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	waitWarm(t, raw.Stat)
	rawUnloaded := unloadedMedian(t, raw)
	rawEmpty := raw.Stat().EmptyAcquireCount()
	rawRun := flood(t, raw)
	rawEmpty = raw.Stat().EmptyAcquireCount() - rawEmpty
	rawRatio := float64(median(rawRun.quiet)) / float64(rawUnloaded)
	raw.Close()

	// Behind tenantdb, with 10 per tenant and a queue large enough for the burst.
	p, err := tenantdb.New(context.Background(), warmConfig(t), tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"standard": {MaxConns: perTenantCap, MaxWaiting: noisyQueries}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitWarm(t, p.Pgxpool().Stat)
	unloaded := unloadedMedian(t, p)
	w := startQuietWaits(p)
	run := flood(t, p)
	quietWait, empty := w.end(len(run.quiet))
	ratio := float64(median(run.quiet)) / float64(unloaded)

	t.Logf("quiet median: unloaded %v; raw pgxpool %v (%.1fx, %d acquires waited for a connection); tenantdb %v (%.2fx, quiet's mean wait at the gate %v, %d acquires waited for a connection); noisy backends at most: raw %d, tenantdb %d",
		rawUnloaded, median(rawRun.quiet), rawRatio, rawEmpty, median(run.quiet), ratio, quietWait, empty, rawRun.maxNoisyActive, run.maxNoisyActive)
	// Behind a raw pool the quiet queries queue: slower by far, or, where
	// outside load blurs the times, each waiting for a connection beside
	// the noisy overflow.
	if rawRatio < 4 && rawEmpty < int64(noisyQueries-sharedConns+quietQueries/2) {
		t.Errorf("behind a raw pgxpool the quiet median is only %.1fx its unloaded value and %d acquires waited for a connection: the experiment does not load the pool", rawRatio, rawEmpty)
	}
	if rawRun.maxNoisyActive <= perTenantCap {
		t.Errorf("the sampler saw at most %d noisy backends behind a raw pool: it cannot tell a cap from no cap", rawRun.maxNoisyActive)
	}
	if ratio > 1.5 && w.heldBack(quietWait, empty) {
		t.Errorf("behind tenantdb the quiet median is %.2fx its unloaded value, want at most 1.5x, and it waited %v at the gate on average, %d acquires for a connection", ratio, quietWait, empty)
	}
	if run.maxNoisyActive > perTenantCap {
		t.Errorf("noisy had %d active backends, above its cap of %d", run.maxNoisyActive, perTenantCap)
	}
	if run.noisyOK != noisyQueries {
		t.Errorf("noisy completed %d of %d in queue mode", run.noisyOK, noisyQueries)
	}
	assertNothingHeld(t, p)
}

func TestRejectModeServesTheCapAndRejectsTheRestAtOnce(t *testing.T) {
	p, err := tenantdb.New(context.Background(), warmConfig(t), tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"interactive": {MaxConns: perTenantCap}}, // MaxWaiting 0: reject
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitWarm(t, p.Pgxpool().Stat)
	unloaded := unloadedMedian(t, p)
	w := startQuietWaits(p)
	run := flood(t, p)
	quietWait, empty := w.end(len(run.quiet))

	if run.noisyOK != perTenantCap || len(run.noisyRejected) != noisyQueries-perTenantCap {
		t.Fatalf("noisy: %d served, %d rejected; want %d and %d",
			run.noisyOK, len(run.noisyRejected), perTenantCap, noisyQueries-perTenantCap)
	}
	slowestReject := slices.Max(run.noisyRejected)
	if servedMedian := median(run.noisyServed); slowestReject > servedMedian/10 {
		t.Errorf("slowest rejection took %v, not fast next to a served query (%v)", slowestReject, servedMedian)
	}
	ratio := float64(median(run.quiet)) / float64(unloaded)
	t.Logf("rejections took at most %v; quiet median %v vs unloaded %v (%.2fx), its mean wait at the gate %v, %d acquires waited for a connection",
		slowestReject, median(run.quiet), unloaded, ratio, quietWait, empty)
	if ratio > 1.5 && w.heldBack(quietWait, empty) {
		t.Errorf("quiet median is %.2fx its unloaded value while noisy was rejected, want at most 1.5x, and it waited %v at the gate on average, %d acquires for a connection", ratio, quietWait, empty)
	}
	if run.maxNoisyActive > perTenantCap {
		t.Errorf("noisy had %d active backends, above its cap of %d", run.maxNoisyActive, perTenantCap)
	}
	if s := p.TenantStat("noisy"); s.Rejected != noisyQueries-perTenantCap || s.Acquired != perTenantCap {
		t.Errorf("noisy stats = %+v", s)
	}
	assertNothingHeld(t, p)
}
