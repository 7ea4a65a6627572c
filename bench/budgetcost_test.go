package bench

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// BenchmarkBudgetAcquireRelease is what a budget costs the acquire and
// release a user makes (issue 46 asks at most 1.05x): two tenantdb.Pools
// on the same server, one whose plan has no budget and one whose plan has
// a budget that never runs out, each Acquire and Release of a real
// connection, no query. They run in turns of budgetBlock, alternating
// which goes first, so that both share what the machine does meanwhile.
// It reports the median turn of each (which the machine's interruptions
// do not move), their ratio budget/plain, and the CPU time of the
// benchmark's thread per op and its ratio (Linux), which a busy machine
// does not inflate.
func BenchmarkBudgetAcquireRelease(b *testing.B) {
	newPool := func(budget pool.Budget) *tenantdb.Pool {
		p, err := tenantdb.New(context.Background(), pgxConfig(b), tenantdb.Config{
			Plans: map[string]tenantdb.Plan{"standard": {MaxConns: 10, MaxWaiting: 100, Budget: budget}},
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
		tenantdbtest.Eventually(b, time.Minute, "every connection open and idle", func() bool {
			return p.Pgxpool().Stat().IdleConns() == maxConns
		})
		return p
	}
	pools := [2]*tenantdb.Pool{newPool(pool.Budget{}), newPool(pool.Budget{Rate: 1e6})}
	ctx := tenantdb.WithTenant(context.Background(), "acme")
	runtime.LockOSThread() // for threadCPU
	defer runtime.UnlockOSThread()
	_, cpuOK := threadCPU()
	var turns [2][]time.Duration
	var cpu [2]time.Duration
	turn := func(side int) {
		p := pools[side]
		start := time.Now()
		cpuStart, _ := threadCPU()
		for range budgetBlock {
			c, err := p.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			c.Release()
		}
		cpuEnd, _ := threadCPU()
		turns[side] = append(turns[side], time.Since(start))
		cpu[side] += cpuEnd - cpuStart
	}
	n := 0
	for b.Loop() {
		first := n % 2
		turn(first)
		turn(1 - first)
		n++
	}
	var med [2]float64
	for i := range turns {
		slices.Sort(turns[i])
		med[i] = float64(turns[i][len(turns[i])/2]) / budgetBlock
	}
	b.ReportMetric(med[0], "plain-ns/op")
	b.ReportMetric(med[1], "budget-ns/op")
	b.ReportMetric(med[1]/med[0], "budget/plain")
	if cpuOK {
		perOp := func(d time.Duration) float64 { return float64(d) / float64(n*budgetBlock) }
		b.ReportMetric(perOp(cpu[0]), "plain-cpu-ns/op")
		b.ReportMetric(perOp(cpu[1]), "budget-cpu-ns/op")
		b.ReportMetric(float64(cpu[1])/float64(cpu[0]), "budget/plain-cpu")
	}
	if s := pools[1].TenantStat("acme"); !s.Budgeted || s.OverBudget != 0 {
		b.Fatalf("the budgeted pool: Budgeted %v, OverBudget %d; want a budget that never refused", s.Budgeted, s.OverBudget)
	}
}

// budgetBlock is how many acquire+release BenchmarkBudgetAcquireRelease
// times in one turn.
const budgetBlock = 200
