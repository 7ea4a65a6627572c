package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// The tests of tenants across servers run three PostgreSQL servers, each
// named by its cluster_name, so that a statement says from the server's
// side where it ran, and each keeps a table of the tenants whose statements
// it ran.
const (
	serverCount = 3
	serverApp   = "tenantdb-servers" // the application_name of the Pools' connections
)

// fleet is the three servers of the tests.
type fleet struct {
	names  []string
	pgs    map[string]*tenantdbtest.Postgres
	admins map[string]*pgx.Conn
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	if os.Getenv("TENANTDB_POSTGRES_DSN") != "" {
		t.Skip("needs three servers of its own; TENANTDB_POSTGRES_DSN names one")
	}
	ctx := context.Background()
	f := &fleet{pgs: map[string]*tenantdbtest.Postgres{}, admins: map[string]*pgx.Conn{}}
	for i := range serverCount {
		name := fmt.Sprintf("s%d", i)
		f.names = append(f.names, name)
		pg := tenantdbtest.StartPostgres(t, tenantdbtest.WithSetting("cluster_name", name))
		f.pgs[name] = pg
		admin, err := pgx.Connect(ctx, pg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Close(context.Background()) })
		f.admins[name] = admin
		for _, sql := range []string{
			"create table if not exists seen (tenant text, server text default current_setting('cluster_name'))",
			"create database app",
		} {
			if _, err := admin.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
		appCfg, _ := pgx.ParseConfig(pg.DSN)
		appCfg.Database = "app"
		app, err := pgx.ConnectConfig(ctx, appCfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = app.Exec(ctx, "create table seen (tenant text, server text default current_setting('cluster_name'))")
		app.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// placeOf is the placement of the tests: tenant tNNN on server s(NNN%3),
// the odd ones in database app there, the even ones in the server's own.
func placeOf(tenant string) (tenantdb.Placement, error) {
	var n int
	if _, err := fmt.Sscanf(tenant, "t%d", &n); err != nil {
		if tenant == "ghost" {
			return tenantdb.Placement{Server: "s9"}, nil
		}
		return tenantdb.Placement{}, fmt.Errorf("tenant %q is in no directory entry", tenant)
	}
	p := tenantdb.Placement{Server: fmt.Sprintf("s%d", n%serverCount)}
	if n%2 == 1 {
		p.Database = "app"
	}
	return p, nil
}

// pool returns a Pool over the fleet, budget connections on each server.
func (f *fleet) pool(t *testing.T, budget int32, cfg tenantdb.Config) *tenantdb.Pool {
	t.Helper()
	return f.poolWith(t, budget, cfg, nil)
}

// poolWith is pool, with edit applied to each server's config.
func (f *fleet) poolWith(t *testing.T, budget int32, cfg tenantdb.Config, edit func(name string, c *pgxpool.Config)) *tenantdb.Pool {
	t.Helper()
	servers := map[string]*pgxpool.Config{}
	for name, pg := range f.pgs {
		c, err := pgxpool.ParseConfig(pg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		c.MaxConns = budget
		c.ConnConfig.RuntimeParams["application_name"] = serverApp
		if edit != nil {
			edit(name, c)
		}
		servers[name] = c
	}
	if cfg.Placement == nil {
		cfg.Placement = func(_ context.Context, tenant string) (tenantdb.Placement, error) { return placeOf(tenant) }
	}
	p, err := tenantdb.NewServers(context.Background(), servers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// ours counts our connections on server name, as the server does.
func (f *fleet) ours(t testing.TB, name string) int {
	t.Helper()
	var n int
	err := f.admins[name].QueryRow(context.Background(),
		"select count(*) from pg_stat_activity where application_name = $1", serverApp).Scan(&n)
	if err != nil {
		t.Error(err)
	}
	return n
}

// seen returns the tenants each server recorded statements of, in both
// its databases, and clears the record.
func (f *fleet) seen(t testing.TB) map[string][]string {
	t.Helper()
	ctx := context.Background()
	out := map[string][]string{}
	for name, admin := range f.admins {
		cfg, _ := pgx.ParseConfig(f.pgs[name].DSN)
		cfg.Database = "app"
		app, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []*pgx.Conn{admin, app} {
			rows, _ := c.Query(ctx, "select distinct tenant from seen where server = current_setting('cluster_name')")
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			out[name] = append(out[name], got...)
			if _, err := c.Exec(ctx, "truncate seen"); err != nil {
				t.Fatal(err)
			}
		}
		app.Close(ctx)
		slices.Sort(out[name])
	}
	return out
}

func TestServers(t *testing.T) {
	f := startFleet(t)
	t.Run("EveryStatementOnItsTenantsServer", f.testEveryStatement)
	t.Run("PlacementFailsClosed", f.testFailsClosed)
	t.Run("FullServerHoldsOnlyItsTenants", f.testFullServer)
	t.Run("SizingPerServer", f.testSizing)
	t.Run("Program", f.testProgram)
	t.Run("MoveUnderLoad", f.testMoveUnderLoad)
	t.Run("MoveEndsLongCalls", f.testMoveEndsLongCalls)
	t.Run("MoveEndsCallsOnEveryPath", f.testMoveEndsEveryPath)
	t.Run("MoveAwaitsConnectsOfEndedCalls", f.testMoveAwaitsConnects)
	t.Run("RoleDefaultsPerServer", f.testRoleDefaultsPerServer)
	t.Run("DownServerFailsFast", f.testDownServer) // last: it stops s2 and starts it again
}

// testEveryStatement runs 300 tenants over the three servers, through every
// method, and checks from the servers' side that each statement ran on its
// tenant's server and in its database, and that no server ever counted more
// of our connections than its budget.
func (f *fleet) testEveryStatement(t *testing.T) {
	const tenants, budget = 300, 10
	p := f.pool(t, budget, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"p": {MaxConns: 2, MaxWaiting: tenantdb.Unbounded}},
	})
	stop := make(chan struct{})
	most := map[string]*atomic.Int64{}
	for _, name := range f.names {
		most[name] = new(atomic.Int64)
	}
	var samples atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(2 * time.Millisecond) // the sampling rate, not synchronisation
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, name := range f.names {
				if n := int64(f.ours(t, name)); n > most[name].Load() {
					most[name].Store(n)
				}
			}
			samples.Add(1)
		}
	}()
	const stmt = "insert into seen (tenant) values ($1) returning current_setting('cluster_name'), current_database()"
	check := func(tenant, server, db string) error {
		want, _ := placeOf(tenant)
		wantDB := want.Database
		if wantDB == "" {
			wantDB = f.pgs[want.Server].Database // the server config's own
		}
		if server != want.Server || db != wantDB {
			return fmt.Errorf("%s's statement ran on %s in %s, not on %s in %s", tenant, server, db, want.Server, wantDB)
		}
		return nil
	}
	methods := []func(ctx context.Context, tenant string) (server, db string, err error){
		func(ctx context.Context, tenant string) (server, db string, err error) {
			err = p.QueryRow(ctx, stmt, tenant).Scan(&server, &db)
			return
		},
		func(ctx context.Context, tenant string) (server, db string, err error) {
			err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "select pg_sleep(0.005)"); err != nil {
					return err
				}
				return tx.QueryRow(ctx, stmt, tenant).Scan(&server, &db)
			})
			return
		},
		func(ctx context.Context, tenant string) (server, db string, err error) {
			b := &pgx.Batch{}
			b.Queue(stmt, tenant).QueryRow(func(r pgx.Row) error { return r.Scan(&server, &db) })
			err = p.SendBatch(ctx, b).Close()
			return
		},
		func(ctx context.Context, tenant string) (server, db string, err error) {
			err = p.AcquireFunc(ctx, func(c tenantdb.Conn) error { return c.QueryRow(ctx, stmt, tenant).Scan(&server, &db) })
			return
		},
	}
	var wg sync.WaitGroup
	errs := make(chan error, tenants*len(methods))
	for i := range tenants {
		wg.Go(func() {
			tenant := tenantN(i)
			for _, m := range methods {
				server, db, err := m(as(tenant), tenant)
				if err == nil {
					err = check(tenant, server, db)
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", tenant, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	seen := f.seen(t)
	for s, name := range f.names {
		var want []string
		for i := s; i < tenants; i += serverCount {
			want = append(want, tenantN(i))
		}
		if !slices.Equal(seen[name], want) {
			t.Errorf("server %s recorded statements of %d tenants, want its %d: %v", name, len(seen[name]), len(want), seen[name])
		}
		t.Logf("server %s: at most %d of our connections in %d samples", name, most[name].Load(), samples.Load())
		if most[name].Load() > budget {
			t.Errorf("server %s counted %d of our connections, over its budget of %d", name, most[name].Load(), budget)
		}
	}
	st := p.ServersStat()
	for _, s := range st {
		if s.Budget != budget || s.Open > budget {
			t.Errorf("stat of server %s: %+v, want a budget of %d and no more open", s.Server, s, budget)
		}
	}
	assertNothingHeld(t, p)
}

// testFailsClosed checks that a tenant without a placement, or placed on a
// server the Pool was not given, fails with ErrNoPlacement and runs nowhere.
func (f *fleet) testFailsClosed(t *testing.T) {
	p := f.pool(t, 4, tenantdb.Config{})
	for _, tenant := range []string{"nowhere", "ghost"} {
		_, err := p.Exec(as(tenant), "insert into seen (tenant) values ($1)", tenant)
		if !errors.Is(err, tenantdb.ErrNoPlacement) {
			t.Errorf("%s: got %v, want ErrNoPlacement", tenant, err)
		}
	}
	if _, err := p.Exec(as("t000"), "insert into seen (tenant) values ($1)", "t000"); err != nil {
		t.Fatal(err)
	}
	seen := f.seen(t)
	want := map[string][]string{"s0": {"t000"}}
	for _, name := range f.names {
		if !slices.Equal(seen[name], want[name]) {
			t.Errorf("server %s recorded statements of %v, want %v", name, seen[name], want[name])
		}
	}
	assertNothingHeld(t, p)
}

// testFullServer holds the whole budget of s0 with statements blocked on a
// lock, and checks that a tenant of s1 is served meanwhile while another
// tenant of s0 waits for s0's capacity.
func (f *fleet) testFullServer(t *testing.T) {
	const budget = 4
	p := f.pool(t, budget, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"p": {MaxConns: 2, MaxWaiting: tenantdb.Unbounded}},
	})
	ctx := context.Background()
	lock := f.admins["s0"]
	if _, err := lock.Exec(ctx, "select pg_advisory_lock(7)"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	blocked := []string{"t000", "t006"} // on s0, in its own database: where the lock is
	for _, tenant := range blocked {
		for range 2 {
			wg.Go(func() {
				if _, err := p.Exec(as(tenant), "select pg_advisory_lock_shared(7)"); err != nil {
					t.Error(err)
				}
			})
		}
	}
	eventually(t, "s0's budget is held", func() bool {
		var n int
		_ = lock.QueryRow(ctx, "select count(*) from pg_locks where locktype = 'advisory' and not granted").Scan(&n)
		return n == budget
	})
	waiter := make(chan error, 1)
	go func() { _, err := p.Exec(as("t003"), "select 1"); waiter <- err }() // s0 too
	eventually(t, "t003 waits for s0", func() bool { return p.TenantStat("t003").Waiting == 1 })

	var server string
	if err := p.QueryRow(as("t001"), "select current_setting('cluster_name')").Scan(&server); err != nil || server != "s1" {
		t.Fatalf("t001 on s1 while s0 is full: %q, %v", server, err)
	}
	if st := p.TenantStat("t003"); st.Waiting != 1 {
		t.Fatalf("t003 no longer waits while s0 is full: %+v", st)
	}
	if _, err := lock.Exec(ctx, "select pg_advisory_unlock(7)"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := <-waiter; err != nil {
		t.Fatal(err)
	}
	assertNothingHeld(t, p)
}

// tenantIDs matches the tenant IDs of tenantN.
var tenantIDs = regexp.MustCompile(`t[0-9]{3}`)

// testDownServer stops s2 and checks that, once a connect to it has failed,
// its tenants' calls fail with ErrServerDown without dialling it again
// (counted by the configs' DialFunc), while the other servers' tenants are
// served; and that s2's tenants are served again once it is back.
func (f *fleet) testDownServer(t *testing.T) {
	var dials sync.Map // server name -> *atomic.Int64
	for _, name := range f.names {
		dials.Store(name, new(atomic.Int64))
	}
	dialsTo := func(name string) int64 { v, _ := dials.Load(name); return v.(*atomic.Int64).Load() }
	p := f.poolWith(t, 4, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"p": {MaxConns: 2, MaxWaiting: tenantdb.Unbounded}},
	}, func(name string, c *pgxpool.Config) {
		c.ConnConfig.ConnectTimeout = 5 * time.Second
		dialer := &net.Dialer{}
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			v, _ := dials.Load(name)
			v.(*atomic.Int64).Add(1)
			return dialer.DialContext(ctx, network, addr)
		}
	})
	ctx := context.Background()
	for _, tenant := range []string{"t000", "t001", "t002", "t005"} { // s0, s1, s2, s2
		if _, err := p.Exec(as(tenant), "select 1"); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.pgs["s2"].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = f.pgs["s2"].Start(ctx)
		}
	}()
	// Its open connections fail as pgxpool finds them broken; then a connect
	// fails, and the server is known down.
	var err error
	for range 20 {
		if _, err = p.Exec(as("t002"), "select 1"); errors.Is(err, tenantdb.ErrServerDown) {
			break
		}
	}
	if !errors.Is(err, tenantdb.ErrServerDown) {
		t.Fatalf("s2 stopped, 20 calls later: %v, want ErrServerDown", err)
	}
	before, start := dialsTo("s2"), time.Now()
	var wg sync.WaitGroup
	var downs, others, slowest atomic.Int64
	for i := range 60 {
		wg.Go(func() {
			tenant := tenantN(i) // 20 on each server
			callStart := time.Now()
			_, err := p.Exec(as(tenant), "select 1")
			took := int64(time.Since(callStart))
			want, _ := placeOf(tenant)
			switch {
			case want.Server == "s2" && errors.Is(err, tenantdb.ErrServerDown):
				downs.Add(1)
				// The failure was another call's: its tenant is not for this
				// one to learn (the isolation checker saw it named).
				for _, named := range tenantIDs.FindAllString(err.Error(), -1) {
					if named != tenant {
						t.Errorf("%s's error names tenant %s: %v", tenant, named, err)
					}
				}
				for old := slowest.Load(); took > old && !slowest.CompareAndSwap(old, took); old = slowest.Load() {
				}
			case want.Server != "s2" && err == nil:
				others.Add(1)
			default:
				t.Errorf("%s on %s: %v", tenant, want.Server, err)
			}
		})
	}
	wg.Wait()
	t.Logf("s2's calls failed with ErrServerDown in at most %v each", time.Duration(slowest.Load()))
	// One call per downHold (a second) tries again; the rest dial nothing.
	tries := int64(time.Since(start)/time.Second) + 1
	if d := dialsTo("s2") - before; d > tries {
		t.Errorf("%d dials to s2 while it was known down for %v, want at most %d", d, time.Since(start), tries)
	}
	if downs.Load() < 20-tries || others.Load() != 40 {
		t.Errorf("%d of s2's 20 calls failed with ErrServerDown, %d of the others' 40 were served", downs.Load(), others.Load())
	}
	var sst []tenantdb.ServerStat
	sst = p.ServersStat()
	if !sst[2].Down || sst[0].Down || sst[1].Down {
		t.Errorf("ServersStat says down: s0 %v, s1 %v, s2 %v; want s2 only", sst[0].Down, sst[1].Down, sst[2].Down)
	}

	if err := f.pgs["s2"].Start(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	admin, err := pgx.Connect(ctx, f.pgs["s2"].DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	f.admins["s2"] = admin
	eventually(t, "s2's tenants are served again", func() bool {
		_, err := p.Exec(as("t002"), "select 1")
		return err == nil
	})
	assertNothingHeld(t, p)
}

// testSizing checks each server's budget against that server's
// max_connections.
func (f *fleet) testSizing(t *testing.T) {
	p := f.pool(t, 7, tenantdb.Config{})
	got, err := p.CheckServers(context.Background(), 3)
	if err != nil {
		t.Fatal(err)
	}
	var want []tenantdb.ServerSizing
	for _, name := range f.names {
		want = append(want, tenantdb.ServerSizing{Server: name, Processes: 3, Demand: 21,
			MaxConnections: tenantdbtest.DefaultMaxConnections - 3}) // superuser_reserved_connections 3
	}
	if !slices.Equal(got, want) {
		t.Errorf("CheckServers = %+v, want %+v", got, want)
	}
	for _, s := range got {
		if !s.Fits() {
			t.Errorf("%s: 3 × 7 does not fit in %d", s.Server, s.MaxConnections)
		}
	}
}

// testRoleDefaultsPerServer gives the login role a default of its own in
// database app on s1 only, as servers set up apart may, and checks that
// each server's connections are judged by that server's defaults: both
// serve (one baseline for the whole Pool refused s1's, read on s0 first),
// and a default a tenant's SQL could have set on s0 after the start is
// still refused there.
func (f *fleet) testRoleDefaultsPerServer(t *testing.T) {
	ctx := context.Background()
	alter := func(server, sql string) {
		t.Helper()
		if _, err := f.admins[server].Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range f.names {
		t.Cleanup(func() { alter(name, "alter role current_user in database app reset all") })
	}
	alter("s1", "alter role current_user in database app set statement_timeout = '7min'")
	p := f.pool(t, 2, tenantdb.Config{})
	const timeout = "select current_setting('statement_timeout')"
	// t3 is in app on s0, t1 in app on s1: s0's connection is the Pool's first.
	for _, c := range []struct{ tenant, want string }{{"t3", "0"}, {"t1", "7min"}} {
		var got string
		if err := p.QueryRow(as(c.tenant), timeout).Scan(&got); err != nil {
			t.Fatalf("%s: %v (its server's own defaults must not be judged by another server's)", c.tenant, err)
		}
		if got != c.want {
			t.Errorf("%s: statement_timeout %q, want %q", c.tenant, got, c.want)
		}
	}
	// A change on s0 after its first connection: t9 (app on s0) needs a new
	// connection while t3 holds the one open there.
	held, err := p.Acquire(as("t3"))
	if err != nil {
		t.Fatal(err)
	}
	alter("s0", "alter role current_user in database app set search_path = evil, public")
	var got string
	err = p.QueryRow(as("t9"), "select current_setting('search_path')").Scan(&got)
	if !errors.Is(err, tenantdb.ErrRoleDefaultsChanged) {
		t.Errorf("t9 on s0 after its login role's default changed there: %q, %v; want ErrRoleDefaultsChanged", got, err)
	}
	held.Release()
	alter("s0", "alter role current_user in database app reset all")
	if err := p.QueryRow(as("t9"), "select current_setting('search_path')").Scan(&got); err != nil || got == "evil, public" {
		t.Errorf("t9 with the default put back: %q, %v", got, err)
	}
	assertNothingHeld(t, p)
}
