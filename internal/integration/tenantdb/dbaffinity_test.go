package tenantdb_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// Affinity with a database per tenant: more busy databases than the budget.
const (
	affinityBudget  = 3
	affinityTenants = 9 // t100 to t108, each in its own database
	affinityWorkers = 2 // per tenant, each call after the last
	affinityCalls   = 8 // per worker
)

// affinityPool is a Pool over affinityBudget connections with Config.Affinity
// affinity (0 for the default with Database).
func (s *perTenant) affinityPool(t *testing.T, affinity int) *tenantdb.Pool {
	return s.pool(t, affinityBudget, tenantdb.Config{
		Plans:    map[string]tenantdb.Plan{"p": {MaxConns: 3, MaxWaiting: tenantdb.Unbounded}},
		Affinity: affinity,
	})
}

// testAffinityCutsConnects runs the same fixed workload (affinityTenants
// tenants in as many databases, affinityWorkers calls of each at a time, on
// a budget of affinityBudget) on today's fair order (Affinity -1) and on the
// default affinity, and compares the connections each opened per call: with
// affinity a released connection goes to its database's next call, so far
// fewer are opened.
func (s *perTenant) testAffinityCutsConnects(t *testing.T) {
	perCall := map[int]float64{}
	for _, affinity := range []int{-1, 0} {
		p := s.affinityPool(t, affinity)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range affinityTenants {
			for range affinityWorkers {
				wg.Go(func() {
					<-start
					for range affinityCalls {
						if err := p.QueryRow(as(tenantN(100+i)), "select 1").Scan(new(int)); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
		}
		close(start)
		wg.Wait()
		st := p.DatabasesStat()
		perCall[affinity] = float64(st.Opens) / (affinityTenants * affinityWorkers * affinityCalls)
		t.Logf("Affinity %d: %d opens for %d calls (%.2f a call), %v connecting",
			affinity, st.Opens, affinityTenants*affinityWorkers*affinityCalls, perCall[affinity], st.ConnectTime.Round(time.Millisecond))
		assertNothingHeld(t, p)
		p.Close()
	}
	if perCall[0] > perCall[-1]/2 {
		t.Fatalf("with affinity a call opened %.2f connections, over half of the %.2f of the fair order alone", perCall[0], perCall[-1])
	}
}

// testAffinityServesAColdDatabase: while busy tenants keep every connection
// of the budget and each has two calls waiting for its own database's next
// turn (so that affinity alone, unbounded, would keep them), a tenant whose database has no connection at all is still served,
// several times over: affinity overtakes it a bounded number of times.
// The busy tenants' calls go on until the cold tenant's are done.
func (s *perTenant) testAffinityServesAColdDatabase(t *testing.T) {
	p := s.affinityPool(t, 0)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range affinityBudget {
		for range 3 {
			wg.Go(func() {
				for ctx.Err() == nil {
					err := p.QueryRow(tenantdb.WithTenant(ctx, tenantN(110+i)), "select 1").Scan(new(int))
					if err != nil && ctx.Err() == nil && !pgconn.Timeout(err) {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	eventually(t, "the busy tenants hold the budget and wait for it", func() bool {
		st := p.Stat()
		return st.Tenants.InUse == affinityBudget && st.Tenants.Waiting == 2*affinityBudget
	})
	cold := tenantN(120)
	done := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(as(cold), time.Minute)
		defer cancel()
		for range 3 {
			if err := p.QueryRow(cctx, "select 1").Scan(new(int)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	err := <-done
	waiting := p.Stat().Tenants.Waiting
	stop()
	wg.Wait()
	if err != nil {
		t.Fatalf("the cold tenant's calls beside the busy ones: %v", err)
	}
	if waiting == 0 {
		t.Fatalf("the busy tenants stopped waiting before the cold tenant was served: nothing was overtaken")
	}
	for _, d := range p.AppendDatabaseStat(nil) {
		if d.Database == "tenant_120" && d.Opens == 0 {
			t.Fatalf("the cold tenant's database opened no connection: %+v", d)
		}
	}
	assertNothingHeld(t, p)
}

// testAffinityLeavesNoSessionToAnotherTenant: two tenants in one database,
// one connection. While tenant na has a call waiting, a release of its
// connection leaves the reset to the next holder; when the next holder is
// tenant nb (na's grants by affinity used up), nb's call finds none of
// na's session: no temporary table, its own setting.
func (s *perTenant) testAffinityLeavesNoSessionToAnotherTenant(t *testing.T) {
	pcfg := pgxConfigOn(t, s.pg.DSN, 1)
	pcfg.ConnConfig.RuntimeParams["application_name"] = ourApp
	writes, resets := new(atomic.Int64), new(atomic.Int64)
	countWrites(pcfg, writes, resets)
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:    map[string]tenantdb.Plan{"p": {MaxConns: 1, MaxWaiting: tenantdb.Unbounded}},
		Session:  tenantdb.Session{TenantSetting: "app.tenant_id"},
		Database: func(string) (string, error) { return "tenant_150", nil },
		Affinity: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	type acquired struct {
		c   tenantdb.Conn
		err error
	}
	acquire := func(tenant string) <-chan acquired {
		ch := make(chan acquired, 1)
		go func() {
			c, err := p.Acquire(as(tenant))
			ch <- acquired{c, err}
		}()
		return ch
	}
	waiting := func(tenant string, n int) {
		eventually(t, tenant+" waits", func() bool { return p.TenantStat(tenant).Waiting == n })
	}
	held, err := p.Acquire(as("na"))
	if err != nil {
		t.Fatal(err)
	}
	next := acquire("na")
	waiting("na", 1)
	b := acquire("nb")
	waiting("nb", 1)
	defer func() { // on every path, so that a failure leaves the Pool nothing to wait for when it closes
		held.Release()
		for _, ch := range []<-chan acquired{next, b} {
			if ch != nil {
				go func() {
					if a := <-ch; a.err == nil {
						a.c.Release()
					}
				}()
			}
		}
	}()
	for i := 0; ; i++ {
		if _, err := held.Exec(as("na"), "create temporary table if not exists na_leftover (secret text)"); err != nil {
			t.Fatal(err)
		}
		resets.Store(0)
		held.Release()
		if p.TenantStat("nb").InUse == 1 {
			break
		}
		if i == 10 {
			t.Fatal("nb not served after 10 of na's calls")
		}
		a := <-next
		next = nil
		if a.err != nil {
			t.Fatal(a.err)
		}
		if n := resets.Load(); n != 0 { // a reset at release is done before the connection is back
			t.Fatalf("%d resets at na's release while na had a call waiting, want none (left to the next holder)", n)
		}
		held = a.c
		next = acquire("na")
		waiting("na", 1)
	}
	bc := <-b
	b = nil
	if bc.err != nil {
		t.Fatal(bc.err)
	}
	var leftover bool
	var setting string
	err = bc.c.QueryRow(as("nb"), "select to_regclass('pg_temp.na_leftover') is not null, current_setting('app.tenant_id')").Scan(&leftover, &setting)
	bc.c.Release()
	if err != nil {
		t.Fatal(err)
	}
	if leftover || setting != "nb" {
		t.Fatalf("tenant nb after tenant na's release: na's temporary table there %v, app.tenant_id %q", leftover, setting)
	}
	a := <-next
	next = nil
	if a.err == nil {
		a.c.Release()
	}
	assertNothingHeld(t, p)
}
