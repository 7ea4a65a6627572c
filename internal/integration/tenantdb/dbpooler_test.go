package tenantdb_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// testBehindPgBouncer runs a database per tenant through PgBouncer in
// transaction mode with a "*" database, as docs/databases.md describes:
// 40 tenants in 40 databases, 3 calls each, on a budget of 10. PgBouncer
// keeps a server pool per database and closes an idle server connection
// only after server_idle_timeout, so tenantdb's budget bounds the client
// connections but not the server's: without max_user_connections the server
// counts more backends than the budget; with it set to the budget, no more.
func (s *perTenant) testBehindPgBouncer(t *testing.T) {
	const budget, tenants, calls = 10, 40, 3
	for _, c := range []struct {
		name     string
		settings [][2]string
		bounded  bool
	}{
		{"PgBouncer defaults", nil, false},
		{"max_user_connections = budget", [][2]string{{"max_user_connections", strconv.Itoa(budget)}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := []tenantdbtest.PgBouncerOption{tenantdbtest.WithPoolMode(tenantdbtest.PoolModeTransaction),
				tenantdbtest.WithPgBouncerAnyDatabase()}
			for _, kv := range c.settings {
				opts = append(opts, tenantdbtest.WithPgBouncerSetting(kv[0], kv[1]))
			}
			// Backends of an earlier PgBouncer may still be ending: count only
			// those started since (the container shares the host's clock).
			since := time.Now()
			bouncer := tenantdbtest.StartPgBouncer(t, s.pg, opts...)
			pcfg, err := pgxpool.ParseConfig(bouncer.DSN)
			if err != nil {
				t.Fatal(err)
			}
			pcfg.MaxConns = budget
			pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
			p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
				Plans:    map[string]tenantdb.Plan{"p": {MaxConns: 2, MaxWaiting: tenantdb.Unbounded}},
				Database: tenantDB,
				Session:  tenantdb.Session{TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()

			ctx := context.Background()
			var most atomic.Int64
			stop, sampled := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(sampled)
				tick := time.NewTicker(2 * time.Millisecond) // the sampling rate, not synchronisation
				defer tick.Stop()
				for {
					var n int64
					if err := s.admin.QueryRow(ctx, "select count(*) from pg_stat_activity where datname like 'tenant\\_%' and backend_start >= $1", since).Scan(&n); err == nil && n > most.Load() {
						most.Store(n)
					}
					select {
					case <-stop:
						return
					case <-tick.C:
					}
				}
			}()
			start := time.Now()
			var wg sync.WaitGroup
			var failed atomic.Int64
			for i := range tenants {
				wg.Go(func() {
					tenant := tenantN(i)
					want, _ := tenantDB(tenant)
					for range calls {
						var got string
						if err := p.QueryRow(as(tenant), "select current_database() from pg_sleep(0.01)").Scan(&got); err != nil || got != want {
							failed.Add(1)
							t.Errorf("%s: %q, %v; want %s", tenant, got, err, want)
							return
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			close(stop)
			<-sampled
			st := p.DatabasesStat()
			t.Logf("%s: %d calls in %v; the server counted at most %d backends in tenant databases (budget %d); %d opens, %v connecting",
				c.name, tenants*calls, elapsed.Round(time.Millisecond), most.Load(), budget, st.Opens, st.ConnectTime.Round(time.Millisecond))
			// PgBouncer moves a server connection to another database by
			// closing one and opening another: the closed one's backend can
			// still be ending, and counted, beside its replacement.
			if c.bounded && most.Load() > budget+1 {
				t.Errorf("with max_user_connections = %d the server counted %d backends", budget, most.Load())
			}
			if !c.bounded && most.Load() <= budget {
				t.Logf("note: PgBouncer's defaults stayed within the budget this run (%d)", most.Load())
			}
		})
	}
}
