package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// The class-* scenarios are issue 27's: the noisy tenant's 200 queries are an
// import and the quiet tenant's 50 are its users' reads. In own-* and
// class-queue/class-reject both are tenant acme's (cap 10); in class-tenants
// the import is spread over five tenants beside a sixth tenant's reads.
const (
	batchClass    = "batch"
	classBatchCap = 6    // of acme's 10
	classShare    = 0.75 // of the shared pool's 20: 15
	importers     = 5
)

// classPlans is acme's plan, queueing (the first row) or rejecting
// (its second), with the batch class when classes is set.
func classPlans(queue, classes bool) func(workload) tenantdb.Config {
	return func(w workload) tenantdb.Config {
		plan := tenantdb.Plan{MaxConns: perTenantCap}
		if queue {
			plan.MaxWaiting, plan.MaxWait = w.noisyN+w.quietN, time.Minute
		}
		c := tenantdb.Config{Plans: map[string]tenantdb.Plan{"standard": plan}}
		if classes {
			c.Classes = map[string]tenantdb.Class{batchClass: {
				MaxConns: classBatchCap, MaxShare: classShare, MaxWaiting: w.noisyN, MaxWait: time.Hour,
			}}
		}
		return c
	}
}

// runOwnTenant runs the workload with both the import and the reads as
// acme's: the import in the batch class when the plans have one.
func runOwnTenant(plans func(workload) tenantdb.Config) func(context.Context, *environment, string) ([]result, error) {
	return func(ctx context.Context, env *environment, name string) ([]result, error) {
		tcfg := plans(env.work)
		return env.runClasses(ctx, name, tcfg, func(ctx context.Context, tenant string) context.Context {
			ctx = tenantdb.WithTenant(ctx, "acme")
			if tenant == "noisy" && tcfg.Classes != nil {
				ctx = tenantdb.WithClass(ctx, batchClass)
			}
			return ctx
		})
	}
}

// runClassTenants runs the import as five tenants' batch work, in turn, and
// the reads as tenant quiet's, on a pool the imports saturate (5 x 6 wanted
// of 20): it measures the share of the pool batch held while it had
// requests waiting.
func runClassTenants(ctx context.Context, env *environment, name string) ([]result, error) {
	var next atomic.Int64
	return env.runClasses(ctx, name, classPlans(false, true)(env.work), func(ctx context.Context, tenant string) context.Context {
		if tenant == "quiet" {
			return tenantdb.WithTenant(ctx, "quiet")
		}
		id := fmt.Sprintf("importer%d", next.Add(1)%importers)
		return tenantdb.WithClass(tenantdb.WithTenant(ctx, id), batchClass)
	})
}

// runClasses measures the workload on a tenantdb pool with tcfg, each query
// run in the context as says, and samples what the batch class holds.
func (env *environment) runClasses(ctx context.Context, name string, tcfg tenantdb.Config,
	as func(ctx context.Context, tenant string) context.Context) ([]result, error) {
	cfg, err := env.pgxConfig(env.pg.DSN, sharedConns)
	if err != nil {
		return nil, err
	}
	p, closePool, err := env.openTenantdb(ctx, cfg, tcfg)
	if err != nil {
		return nil, err
	}
	defer closePool()
	q := func(ctx context.Context, tenant string, d time.Duration) error {
		_, err := p.Exec(as(ctx, tenant), sleepSQL(tenant, d))
		return err
	}
	progress("%s: quiet tenant alone (its unloaded latency)", name)
	alone := env.work.quietAlone(ctx, q)
	stop := make(chan struct{})
	var share batchShare
	var wg sync.WaitGroup
	if tcfg.Classes != nil {
		wg.Add(1)
		go func() { defer wg.Done(); share.sample(p, stop) }()
	}
	progress("%s: import %d x %v at once, reads %d x %v over %v", name,
		env.work.noisyN, env.work.noisySleep, env.work.quietN, env.work.quietSleep, env.work.quietSpread)
	noisy, quiet := env.work.flood(ctx, name, q)
	close(stop)
	wg.Wait()
	if s := p.Stat().Tenants; s.InUse != 0 || s.Waiting != 0 {
		return nil, fmt.Errorf("after the run %d slots are in use and %d waiting", s.InUse, s.Waiting)
	}
	nr := noisy.result(name, "noisy")
	nr.BatchShare, nr.MostBatch = share.mean(), share.most
	return []result{nr, quiet.result(name, "quiet"), alone.result(name, "quiet-unloaded")}, nil
}

// batchShare samples, every 5 ms, the fraction of the shared pool the
// batch class holds while some of its requests wait.
type batchShare struct {
	sum      float64
	n, most  int
	capacity int
}

func (b *batchShare) sample(p *tenantdb.Pool, stop <-chan struct{}) {
	b.capacity = p.Gate().Capacity()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		s := p.Stat().Tenants.Classes[1]
		b.most = max(b.most, s.InUse)
		if s.Waiting > 0 {
			b.sum += float64(s.InUse) / float64(b.capacity)
			b.n++
		}
	}
}

func (b *batchShare) mean() float64 {
	if b.n == 0 {
		return 0
	}
	return b.sum / float64(b.n)
}
