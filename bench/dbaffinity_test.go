package bench

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// The affinity workloads: more busy databases than the budget. A workload's
// tenants are spread over affDatabases databases (tenant i in bench_(i mod
// affDatabases)); its first busy tenants keep affBusyWorkers calls going
// each, the others one, on a budget of affBudget connections.
const (
	affDatabases   = 30
	affBudget      = 10
	affBusyWorkers = 3
	affRound       = 8 * time.Second
	affRounds      = 2 // of each order, interleaved
)

// affWorkloads are the workloads: every tenant busy, one in each database;
// a third of them busy; and two tenants in each database, a sixth busy.
var affWorkloads = []struct{ tenants, busy int }{{30, 30}, {30, 10}, {60, 10}}

// affOrders are the orders compared: the fair order alone (Affinity -1)
// and the default with Database.
var affOrders = []struct {
	name     string
	affinity int
}{{"fair", -1}, {"affine", 0}}

// BenchmarkDatabaseAffinity runs each affinity workload in each of
// affOrders, in interleaved rounds of affRound, and reports for each: the
// connections opened per call and their mean connect time, calls a
// second, the p50, p99 and longest call (its wait for the gate included),
// the one-worker tenants' calls a second, p50 and p99, and the opens of
// the most reopened database per ten seconds.
func BenchmarkDatabaseAffinity(b *testing.B) {
	createBenchDatabases(b)
	template, err := pgxpool.ParseConfig(postgres(b).DSN)
	if err != nil {
		b.Fatal(err)
	}
	template.MaxConns, template.MinConns = affBudget, 0
	template.ConnConfig.RuntimeParams["application_name"] = "bench-affinity"
	for b.Loop() {
		for _, w := range affWorkloads {
			runs := make([]affRun, len(affOrders))
			for range affRounds {
				for i, order := range affOrders {
					runs[i].add(b, order.name, runAffinity(b, template, w.tenants, w.busy, order.affinity))
				}
			}
			for i, order := range affOrders {
				runs[i].report(b, fmt.Sprintf("%dt%db-%s", w.tenants, w.busy, order.name))
			}
		}
	}
}

// affRun is what rounds of one order measured.
type affRun struct {
	all, quiet    []time.Duration
	calls, opens  int64
	took          time.Duration
	connecting    time.Duration
	busiestPer10s float64
	tenants, busy int
}

func (r *affRun) add(b *testing.B, name string, o *affRun) {
	r.all, r.quiet = append(r.all, o.all...), append(r.quiet, o.quiet...)
	r.calls, r.opens, r.took, r.connecting = r.calls+o.calls, r.opens+o.opens, r.took+o.took, r.connecting+o.connecting
	r.busiestPer10s = max(r.busiestPer10s, o.busiestPer10s)
	b.Logf("%s, %d tenants, %d busy: %d calls in %v, %.2f opens a call, busiest database %.0f opens per 10 s",
		name, o.tenants, o.busy, o.calls, o.took.Round(time.Millisecond), float64(o.opens)/float64(o.calls), o.busiestPer10s)
}

func (r *affRun) report(b *testing.B, name string) {
	q := func(ds []time.Duration, f float64) float64 {
		slices.Sort(ds)
		return float64(ds[int(f*float64(len(ds)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(r.opens)/float64(r.calls), name+"-connects/call")
	b.ReportMetric(float64(r.connecting.Microseconds())/1000/float64(max(r.opens, 1)), name+"-connect-ms")
	b.ReportMetric(float64(r.calls)/r.took.Seconds(), name+"-calls/s")
	b.ReportMetric(q(r.all, 0.5), name+"-p50-ms")
	b.ReportMetric(q(r.all, 0.99), name+"-p99-ms")
	b.ReportMetric(q(r.all, 1), name+"-max-ms")
	if len(r.quiet) > 0 {
		b.ReportMetric(float64(len(r.quiet))/r.took.Seconds(), name+"-one-worker-calls/s")
		b.ReportMetric(q(r.quiet, 0.5), name+"-one-worker-p50-ms")
		b.ReportMetric(q(r.quiet, 0.99), name+"-one-worker-p99-ms")
	}
	b.ReportMetric(r.busiestPer10s, name+"-busiest-db-opens/10s")
}

// runAffinity runs one round of the workload of tenants tenants, busy of
// them busy, on a Pool of its own with Config.Affinity affinity.
func runAffinity(b *testing.B, template *pgxpool.Config, tenants, busy, affinity int) *affRun {
	ctx := context.Background()
	p, err := tenantdb.New(ctx, template.Copy(), tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"p": {MaxConns: affBusyWorkers + 1, MaxWaiting: tenantdb.Unbounded}},
		Database: func(tenant string) (string, error) {
			i, err := strconv.Atoi(tenant)
			return fmt.Sprintf("bench_%03d", i%affDatabases), err
		},
		Affinity: affinity,
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	r := &affRun{tenants: tenants, busy: busy}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	var end time.Time
	for i := range tenants {
		workers := 1
		if i < busy {
			workers = affBusyWorkers
		}
		tctx := tenantdb.WithTenant(ctx, fmt.Sprintf("%03d", i))
		for range workers {
			wg.Go(func() {
				<-start
				var own []time.Duration
				for time.Now().Before(end) {
					t0 := time.Now()
					if err := p.QueryRow(tctx, "select 1").Scan(new(int)); err != nil {
						b.Error(err)
						return
					}
					own = append(own, time.Since(t0))
				}
				mu.Lock()
				r.all = append(r.all, own...)
				if workers == 1 {
					r.quiet = append(r.quiet, own...)
				}
				mu.Unlock()
			})
		}
	}
	t0 := time.Now()
	end = t0.Add(affRound)
	close(start)
	wg.Wait()
	r.took = time.Since(t0)
	r.calls = int64(len(r.all))
	st := p.DatabasesStat()
	r.opens, r.connecting = st.Opens, st.ConnectTime
	var busiest int64
	for _, d := range p.AppendDatabaseStat(nil) {
		busiest = max(busiest, d.Opens)
	}
	r.busiestPer10s = float64(busiest) * float64(10*time.Second) / float64(r.took)
	return r
}
