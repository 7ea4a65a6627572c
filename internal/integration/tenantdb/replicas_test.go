package tenantdb_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/internal/doctest"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tenantdb/tenantsql"
)

// replicaPair is a primary and its streaming replica, each naming itself
// with cluster_name, so that a statement says from the server's side where
// it ran.
type replicaPair struct {
	primary, replica *tenantdbtest.Postgres
	onPrimary        *pgx.Conn // an admin connection to each, on no tenant's behalf
	onReplica        *pgx.Conn
	dials            atomic.Int64 // connects to the replica by the Pools' pgxpools
}

// replicaApp is the application_name of the Pools' connections.
const replicaApp = "tenantdb-replicas"

func startReplicaPair(t *testing.T) *replicaPair {
	t.Helper()
	if os.Getenv("TENANTDB_POSTGRES_DSN") != "" {
		t.Skip("needs a primary and a replica of its own; TENANTDB_POSTGRES_DSN names one server")
	}
	ctx := context.Background()
	rp := &replicaPair{primary: tenantdbtest.StartPostgres(t, tenantdbtest.WithSetting("cluster_name", "primary"))}
	var err error
	if rp.onPrimary, err = pgx.Connect(ctx, rp.primary.DSN); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rp.onPrimary.Close(context.Background()) })
	for _, sql := range []string{"create table seen (tenant text)", "create database app"} {
		if _, err := rp.onPrimary.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	rp.replica = tenantdbtest.StartReplica(t, rp.primary, tenantdbtest.WithSetting("cluster_name", "replica"))
	if rp.onReplica, err = pgx.Connect(ctx, rp.replica.DSN); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rp.onReplica.Close(context.Background()) })
	return rp
}

// pool returns a Pool on the pair: one server "s0" of budget connections
// on the primary, its replica of replicaBudget, with r's policy.
func (rp *replicaPair) pool(t *testing.T, budget, replicaBudget int32, cfg tenantdb.Config, r tenantdb.Replicas) *tenantdb.Pool {
	t.Helper()
	p := rp.unclosedPool(t, budget, replicaBudget, cfg, r)
	t.Cleanup(p.Close)
	return p
}

// unclosedPool is pool without closing it when t ends.
func (rp *replicaPair) unclosedPool(t *testing.T, budget, replicaBudget int32, cfg tenantdb.Config, r tenantdb.Replicas) *tenantdb.Pool {
	t.Helper()
	primary, err := pgxpool.ParseConfig(rp.primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	primary.MaxConns = budget
	primary.ConnConfig.RuntimeParams["application_name"] = replicaApp
	replica, err := pgxpool.ParseConfig(rp.replica.DSN)
	if err != nil {
		t.Fatal(err)
	}
	replica.MaxConns = replicaBudget
	replica.ConnConfig.RuntimeParams["application_name"] = replicaApp
	replica.BeforeConnect = func(context.Context, *pgx.ConnConfig) error { // the pools' connects, not the probe's
		rp.dials.Add(1)
		return nil
	}
	r.Configs = []*pgxpool.Config{replica}
	if cfg.Plans == nil {
		cfg.Plans = map[string]tenantdb.Plan{"p": {MaxConns: 2}}
	}
	if cfg.Placement == nil {
		cfg.Placement = func(context.Context, string) (tenantdb.Placement, error) {
			return tenantdb.Placement{Server: "s0"}, nil
		}
	}
	p, err := tenantdb.NewServers(context.Background(), map[string]*pgxpool.Config{"s0": primary}, cfg,
		tenantdb.WithReplicas("s0", r))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// replicaStat is p's one replica's stat.
func replicaStat(p *tenantdb.Pool) tenantdb.ReplicaStat { return p.ServersStat()[0].Replicas[0] }

// waitUsable waits until p's replica is usable (or not), as its stat says.
func waitUsable(t *testing.T, p *tenantdb.Pool, usable bool, what string) {
	t.Helper()
	tenantdbtest.Eventually(t, time.Minute, what, func() bool { return replicaStat(p).Usable == usable })
}

// where runs the statement that names its server through call.
const whereSQL = "select current_setting('cluster_name'), pg_is_in_recovery()"

func TestReplicas(t *testing.T) {
	rp := startReplicaPair(t)
	t.Run("ReadsOnTheReplica", rp.testReadsOnReplica)
	t.Run("SessionOnTheReplica", rp.testSession)
	t.Run("ClassAndDatabaseSQL", rp.testClassAndSQL)
	t.Run("CapsCoverReadsAndWrites", rp.testCaps)
	t.Run("ProbeWhileTheBudgetIsFull", rp.testProbeBudgetFull)
	t.Run("Lag", rp.testLag)
	t.Run("CloseEndsAHungProbe", rp.testCloseHungProbe)
	t.Run("Program", rp.testProgram)
	t.Run("SizingChecksTheReplica", rp.testSizing)
	t.Run("ReplicaStopped", rp.testStopped)                // it stops the replica and starts it again
	t.Run("ConnectFailsOnTheReplica", rp.testConnectFails) // the same
}

// testReadsOnReplica sends a tenant's calls through every method: those
// marked read-only (and a read-only transaction) run on the replica, the
// others on the primary, as the servers say.
func (rp *replicaPair) testReadsOnReplica(t *testing.T) {
	p := rp.pool(t, 4, 4, tenantdb.Config{}, tenantdb.Replicas{MaxLag: 2 * time.Second, ProbeEvery: 50 * time.Millisecond})
	waitUsable(t, p, true, "the replica is probed caught up")
	ctx := tenantdb.WithTenant(context.Background(), "acme")
	methods := map[string]func(ctx context.Context, txOpts pgx.TxOptions) (server string, recovering bool, err error){
		"QueryRow": func(ctx context.Context, _ pgx.TxOptions) (server string, recovering bool, err error) {
			err = p.QueryRow(ctx, whereSQL).Scan(&server, &recovering)
			return
		},
		"Query": func(ctx context.Context, _ pgx.TxOptions) (server string, recovering bool, err error) {
			rows, _ := p.Query(ctx, whereSQL)
			_, err = pgx.ForEachRow(rows, []any{&server, &recovering}, func() error { return nil })
			return
		},
		"BeginTx": func(ctx context.Context, opts pgx.TxOptions) (server string, recovering bool, err error) {
			err = pgx.BeginTxFunc(ctx, p, opts, func(tx pgx.Tx) error { return tx.QueryRow(ctx, whereSQL).Scan(&server, &recovering) })
			return
		},
		"SendBatch": func(ctx context.Context, _ pgx.TxOptions) (server string, recovering bool, err error) {
			b := &pgx.Batch{}
			b.Queue(whereSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&server, &recovering) })
			err = p.SendBatch(ctx, b).Close()
			return
		},
		"AcquireFunc": func(ctx context.Context, _ pgx.TxOptions) (server string, recovering bool, err error) {
			err = p.AcquireFunc(ctx, func(c tenantdb.Conn) error { return c.QueryRow(ctx, whereSQL).Scan(&server, &recovering) })
			return
		},
	}
	for name, call := range methods {
		for _, c := range []struct {
			ctx    context.Context
			opts   pgx.TxOptions
			want   string
			marked string
		}{
			{ctx, pgx.TxOptions{}, "primary", "unmarked"},
			{tenantdb.ReadOnly(ctx), pgx.TxOptions{}, "replica", "ReadOnly"},
			{ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly}, "replica", "a read-only transaction"},
		} {
			if c.opts.AccessMode != "" && name != "BeginTx" {
				continue
			}
			server, recovering, err := call(c.ctx, c.opts)
			if err != nil {
				t.Fatalf("%s, %s: %v", name, c.marked, err)
			}
			if server != c.want || recovering != (c.want == "replica") {
				t.Errorf("%s, %s: ran on %s (in recovery %v), want %s", name, c.marked, server, recovering, c.want)
			}
		}
	}
	// A tenant placed in another database reads it on the replica.
	inApp := rp.pool(t, 4, 4, tenantdb.Config{
		Placement: func(context.Context, string) (tenantdb.Placement, error) {
			return tenantdb.Placement{Server: "s0", Database: "app"}, nil
		},
	}, tenantdb.Replicas{MaxLag: 2 * time.Second, ProbeEvery: 50 * time.Millisecond})
	waitUsable(t, inApp, true, "the replica is probed caught up")
	var server, db string
	if err := inApp.QueryRow(tenantdb.ReadOnly(ctx), "select current_setting('cluster_name'), current_database()").
		Scan(&server, &db); err != nil || server != "replica" || db != "app" {
		t.Errorf("a read of a tenant placed in database app ran on %q in %q (%v), want the replica's app", server, db, err)
	}
	if _, err := p.Exec(tenantdb.ReadOnly(ctx), "insert into seen values ('acme')"); err == nil ||
		!strings.Contains(err.Error(), "read-only transaction") {
		t.Errorf("a write marked read-only: %v, want the replica's refusal", err)
	}
	if s := replicaStat(p); s.Reads < 7 || s.Lag < 0 || s.Lag > 2*time.Second || s.Open == 0 || s.Budget != 4 {
		t.Errorf("replica stat %+v: want 7 reads or more, a lag within MaxLag, connections open within its budget of 4", s)
	}
}

// testSession checks that the replica's connections get the tenant's
// values, and are reset at release as the primary's: with one connection
// to the replica, a tenant's session setting is gone for the next tenant.
func (rp *replicaPair) testSession(t *testing.T) {
	p := rp.pool(t, 4, 1, tenantdb.Config{Session: tenantdb.Session{TenantSetting: "app.tenant_id"}},
		tenantdb.Replicas{MaxLag: 2 * time.Second, ProbeEvery: 50 * time.Millisecond})
	waitUsable(t, p, true, "the replica is probed caught up")
	var pids [2]uint32
	for i, tenant := range []string{"acme", "globex"} {
		ctx := tenantdb.ReadOnly(tenantdb.WithTenant(context.Background(), tenant))
		var server, setting, leak string
		err := p.QueryRow(ctx, "select current_setting('cluster_name'), current_setting('app.tenant_id'), "+
			"coalesce(current_setting('app.leak', true), ''), pg_backend_pid()").Scan(&server, &setting, &leak, &pids[i])
		if err != nil {
			t.Fatal(err)
		}
		if server != "replica" || setting != tenant || leak != "" {
			t.Errorf("%s ran on %s with app.tenant_id %q and app.leak %q: want the replica, its own ID and nothing left",
				tenant, server, setting, leak)
		}
		if _, err := p.Exec(ctx, "select set_config('app.leak', $1, false)", tenant); err != nil {
			t.Fatal(err)
		}
	}
	if pids[0] != pids[1] {
		t.Fatalf("the two tenants had replica connections %d and %d: the test needs them to share one", pids[0], pids[1])
	}
}

// testCaps holds a tenant's whole cap with reads on the replica: its
// writes and further reads are over the cap, until a read ends.
func (rp *replicaPair) testCaps(t *testing.T) {
	p := rp.pool(t, 4, 4, tenantdb.Config{}, tenantdb.Replicas{MaxLag: 2 * time.Second, ProbeEvery: 50 * time.Millisecond})
	waitUsable(t, p, true, "the replica is probed caught up")
	ctx := tenantdb.WithTenant(context.Background(), "acme")
	longCtx, cancel := context.WithCancel(tenantdb.ReadOnly(ctx))
	defer cancel()
	var wg sync.WaitGroup
	for range 2 { // the plan's cap
		wg.Go(func() { _, _ = p.Exec(longCtx, "select pg_sleep(60) /* capped */") })
	}
	tenantdbtest.Eventually(t, time.Minute, "the two reads run on the replica", func() bool {
		var n int
		err := rp.onReplica.QueryRow(context.Background(), "select count(*) from pg_stat_activity "+
			"where application_name = $1 and query like '%capped%' and state = 'active'", replicaApp).Scan(&n)
		return err == nil && n == 2
	})
	for _, c := range []struct {
		ctx  context.Context
		what string
	}{{ctx, "a write"}, {tenantdb.ReadOnly(ctx), "a third read"}} {
		if _, err := p.Exec(c.ctx, "select 1"); !errors.Is(err, tenantdb.ErrOverLimit) {
			t.Errorf("%s while two reads hold the cap of 2: %v, want ErrOverLimit", c.what, err)
		}
	}
	var onPrimary int
	if err := rp.onPrimary.QueryRow(context.Background(),
		"select count(*) from pg_stat_activity where query like '%capped%' and pid <> pg_backend_pid()").Scan(&onPrimary); err != nil || onPrimary != 0 {
		t.Errorf("the primary runs %d of the reads (%v), want none", onPrimary, err)
	}
	cancel()
	wg.Wait()
	if _, err := p.Exec(ctx, "select 1"); err != nil {
		t.Errorf("a write once the reads ended: %v", err)
	}
}

// testLag pauses the replica's replay and writes on the primary: once the
// replica is behind MaxLag, reads go to the primary (ReadPrimary) or fail
// (FailRead); resumed, they go to the replica again.
func (rp *replicaPair) testLag(t *testing.T) {
	const maxLag = 500 * time.Millisecond
	fallback := rp.pool(t, 4, 4, tenantdb.Config{}, tenantdb.Replicas{MaxLag: maxLag, ProbeEvery: 50 * time.Millisecond})
	failing := rp.pool(t, 4, 4, tenantdb.Config{}, tenantdb.Replicas{MaxLag: maxLag, ProbeEvery: 50 * time.Millisecond,
		Unavailable: tenantdb.FailRead})
	waitUsable(t, fallback, true, "the replica is probed caught up")
	waitUsable(t, failing, true, "the replica is probed caught up")
	ctx := tenantdb.ReadOnly(tenantdb.WithTenant(context.Background(), "acme"))
	bg := context.Background()
	if _, err := rp.onReplica.Exec(bg, "select pg_wal_replay_pause()"); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_, _ = rp.onReplica.Exec(bg, "select pg_wal_replay_resume()")
		}
	}()
	var written time.Time
	if err := rp.onPrimary.QueryRow(bg, "insert into seen values ('lag') returning clock_timestamp()").Scan(&written); err != nil {
		t.Fatal(err)
	}
	// The replica stays usable while the probes see it within MaxLag of
	// the write, and not after.
	waitUsable(t, fallback, false, "the paused replica falls behind MaxLag")
	waitUsable(t, failing, false, "the paused replica falls behind MaxLag")
	if s := replicaStat(fallback); s.Lag <= maxLag || !strings.Contains(s.Why, "behind the primary") {
		t.Errorf("stat of the paused replica %+v: want a lag over %v, and why", s, maxLag)
	}
	var server string
	var n int
	if err := fallback.QueryRow(ctx, "select current_setting('cluster_name'), count(*) from seen where tenant = 'lag'").
		Scan(&server, &n); err != nil || server != "primary" || n != 1 {
		t.Errorf("a read behind MaxLag with ReadPrimary ran on %q and saw %d rows (%v): want the primary and the row", server, n, err)
	}
	dials := rp.dials.Load()
	if err := failing.QueryRow(ctx, whereSQL).Scan(&server, new(bool)); !errors.Is(err, tenantdb.ErrReplicaUnavailable) ||
		!strings.Contains(err.Error(), "behind the primary") {
		t.Errorf("a read behind MaxLag with FailRead: %v, want ErrReplicaUnavailable saying it is behind", err)
	}
	if d := rp.dials.Load() - dials; d != 0 {
		t.Errorf("the failed read dialled the replica %d times", d)
	}
	if _, err := rp.onReplica.Exec(bg, "select pg_wal_replay_resume()"); err != nil {
		t.Fatal(err)
	}
	resumed = true
	waitUsable(t, fallback, true, "the resumed replica catches up")
	waitUsable(t, failing, true, "the resumed replica catches up")
	for _, p := range []*tenantdb.Pool{fallback, failing} {
		if err := p.QueryRow(ctx, "select current_setting('cluster_name'), count(*) from seen where tenant = 'lag'").
			Scan(&server, &n); err != nil || server != "replica" || n != 1 {
			t.Errorf("a read once caught up ran on %q and saw %d rows (%v): want the replica and the row", server, n, err)
		}
	}
}

// testCloseHungProbe freezes the replica while the probes run: Close
// returns, and no probe is left running.
func (rp *replicaPair) testCloseHungProbe(t *testing.T) {
	p := rp.unclosedPool(t, 4, 4, tenantdb.Config{}, tenantdb.Replicas{MaxLag: time.Minute, ProbeEvery: 10 * time.Millisecond})
	waitUsable(t, p, true, "the replica is probed caught up")
	if err := rp.replica.Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := rp.replica.Unpause(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	// A probe's query waits for the frozen replica now, up to MaxLag, a
	// minute: once the lag is ten times ProbeEvery, one is stuck, and Close
	// must end it.
	tenantdbtest.Eventually(t, time.Minute, "a probe waits for the frozen replica", func() bool {
		return replicaStat(p).Lag > 100*time.Millisecond
	})
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second): // a failsafe against a hang, not a measure
		t.Fatal("Close did not return while a probe waited for the frozen replica")
	}
	// Close waited for the probes' last deferred call; each goroutine may
	// still be on its way out (the loaded run saw one runnable there), so
	// the stacks are polled, briefly: a probe still at work never leaves.
	buf := make([]byte, 1<<20)
	var stacks string
	gone := func() bool {
		stacks = string(buf[:runtime.Stack(buf, true)])
		return !strings.Contains(stacks, "tenantdb.(*Pool).probe")
	}
	for deadline := time.Now().Add(5 * time.Second); !gone() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // the polling interval of a probe, not synchronisation
	}
	if !gone() {
		t.Errorf("a probe is still running 5 s after Close returned:\n%s", stacks)
	}
}

// testStopped stops the replica: once the probe sees it down, reads go to
// the primary (ReadPrimary) or fail at once without dialling (FailRead);
// started again, they go to the replica again.
func (rp *replicaPair) testStopped(t *testing.T) {
	fallback := rp.pool(t, 4, 4, tenantdb.Config{}, tenantdb.Replicas{MaxLag: 2 * time.Second, ProbeEvery: 50 * time.Millisecond})
	failing := rp.pool(t, 4, 4, tenantdb.Config{}, tenantdb.Replicas{MaxLag: 2 * time.Second, ProbeEvery: 50 * time.Millisecond,
		Unavailable: tenantdb.FailRead})
	waitUsable(t, fallback, true, "the replica is probed caught up")
	waitUsable(t, failing, true, "the replica is probed caught up")
	ctx := tenantdb.ReadOnly(tenantdb.WithTenant(context.Background(), "acme"))
	for _, p := range []*tenantdb.Pool{fallback, failing} { // a connection each, to be broken
		if err := p.QueryRow(ctx, whereSQL).Scan(new(string), new(bool)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rp.replica.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitUsable(t, fallback, false, "the probe sees the stopped replica")
	waitUsable(t, failing, false, "the probe sees the stopped replica")
	dials := rp.dials.Load()
	for range 20 {
		var server string
		if err := fallback.QueryRow(ctx, whereSQL).Scan(&server, new(bool)); err != nil || server != "primary" {
			t.Fatalf("a read with the replica stopped, ReadPrimary: ran on %q (%v), want the primary", server, err)
		}
		err := failing.QueryRow(ctx, whereSQL).Scan(&server, new(bool))
		if !errors.Is(err, tenantdb.ErrReplicaUnavailable) {
			t.Fatalf("a read with the replica stopped, FailRead: %v, want ErrReplicaUnavailable", err)
		}
	}
	if d := rp.dials.Load() - dials; d != 0 {
		t.Errorf("40 reads with the replica known stopped dialled it %d times, want 0", d)
	}
	if s := replicaStat(failing); s.Usable || s.Why == "" {
		t.Errorf("stat of the stopped replica %+v: want unusable, and why", s)
	}
	if err := rp.replica.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitUsable(t, fallback, true, "the replica started again is probed caught up")
	waitUsable(t, failing, true, "the replica started again is probed caught up")
	for _, p := range []*tenantdb.Pool{fallback, failing} {
		var server string
		if err := p.QueryRow(ctx, whereSQL).Scan(&server, new(bool)); err != nil || server != "replica" {
			t.Errorf("a read with the replica back: ran on %q (%v), want the replica", server, err)
		}
	}
}

// testProgram runs the program of docs/servers.md's "A complete program
// with a replica" on the pair and checks where it says each call ran.
func (rp *replicaPair) testProgram(t *testing.T) {
	const heading = "## A complete program with a replica"
	blocks := doctest.GoBlocks(t, doctest.Section(t, heading))
	if len(blocks) == 0 || !strings.HasPrefix(blocks[0], "package main\n") {
		t.Fatalf("docs/servers.md's %q has no complete program", heading)
	}
	root, dir := doctest.Root(t), t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte(blocks[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, "overlay.json")
	target := filepath.Join(root, "tenantdb", "internal", "replicasprogram", "main.go")
	if err := os.WriteFile(overlay, []byte(`{"Replace":{"`+target+`":"`+src+`"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "-overlay="+overlay, "./tenantdb/internal/replicasprogram")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off",
		"PRIMARY_URL="+rp.primary.DSN, "REPLICA_URL="+rp.replica.DSN)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the program failed: %v\n%s", err, out)
	}
	want := "read-only call ran on a replica\nother call ran on the primary\neu1/replica0: 1 read, budget 10"
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("the program printed:\n%s\nwant:\n%s", got, want)
	}
}

// testConnectFails stops the replica between two probes (ProbeEvery 10s),
// with no connection open to it: a read's connect to it fails, marks it
// down, and the read runs on the primary (ReadPrimary) or fails
// (FailRead); the next reads do not dial it; started again, the probe
// makes it usable.
func (rp *replicaPair) testConnectFails(t *testing.T) {
	r := tenantdb.Replicas{MaxLag: time.Minute, ProbeEvery: 10 * time.Second}
	fallback := rp.pool(t, 4, 4, tenantdb.Config{}, r)
	r.Unavailable = tenantdb.FailRead
	failing := rp.pool(t, 4, 4, tenantdb.Config{}, r)
	waitUsable(t, fallback, true, "the replica is probed caught up")
	waitUsable(t, failing, true, "the replica is probed caught up")
	if err := rp.replica.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := tenantdb.ReadOnly(tenantdb.WithTenant(context.Background(), "acme"))
	for _, p := range []*tenantdb.Pool{fallback, failing} {
		if s := replicaStat(p); !s.Usable {
			t.Fatalf("the probe saw the stopped replica before a read could (%s): the test needs a read to", s.Why)
		}
	}
	dials := rp.dials.Load()
	var server string
	if err := fallback.QueryRow(ctx, whereSQL).Scan(&server, new(bool)); err != nil || server != "primary" {
		t.Errorf("a read whose connect to the replica failed, ReadPrimary: ran on %q (%v), want the primary", server, err)
	}
	err := failing.QueryRow(ctx, whereSQL).Scan(&server, new(bool))
	if !errors.Is(err, tenantdb.ErrReplicaUnavailable) {
		t.Errorf("a read whose connect to the replica failed, FailRead: %v, want ErrReplicaUnavailable", err)
	}
	if d := rp.dials.Load() - dials; d != 2 {
		t.Errorf("the two reads connected to the replica %d times, want once each", d)
	}
	for _, p := range []*tenantdb.Pool{fallback, failing} {
		if s := replicaStat(p); s.Usable || !strings.Contains(s.Why, "is down") {
			t.Errorf("stat after the failed connect %+v: want it down", s)
		}
	}
	dials = rp.dials.Load()
	for range 10 {
		if err := fallback.QueryRow(ctx, whereSQL).Scan(&server, new(bool)); err != nil || server != "primary" {
			t.Fatalf("a read with the replica known down, ReadPrimary: ran on %q (%v)", server, err)
		}
		if err := failing.QueryRow(ctx, whereSQL).Scan(&server, new(bool)); !errors.Is(err, tenantdb.ErrReplicaUnavailable) {
			t.Fatalf("a read with the replica known down, FailRead: %v", err)
		}
	}
	if d := rp.dials.Load() - dials; d != 0 {
		t.Errorf("20 reads with the replica known down connected to it %d times, want 0", d)
	}
	if err := rp.replica.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitUsable(t, fallback, true, "the probe finds the replica started again")
	waitUsable(t, failing, true, "the probe finds the replica started again")
	if err := fallback.QueryRow(ctx, whereSQL).Scan(&server, new(bool)); err != nil || server != "replica" {
		t.Errorf("a read with the replica back: ran on %q (%v), want the replica", server, err)
	}
}

// testSizing checks that CheckServers checks the replica against its own
// max_connections, with its budget and its probe's connection per process,
// and the primary with its budget and the probe's connection to it.
func (rp *replicaPair) testSizing(t *testing.T) {
	p := rp.pool(t, 4, 6, tenantdb.Config{}, tenantdb.Replicas{})
	got, err := p.CheckServers(context.Background(), 3)
	if err != nil {
		t.Fatal(err)
	}
	maxConns := tenantdbtest.DefaultMaxConnections - 3 // less superuser_reserved_connections
	want := []tenantdb.ServerSizing{
		{Server: "s0", MaxConnections: maxConns, Processes: 3, Demand: 15},
		{Server: "s0/replica0", MaxConnections: maxConns, Processes: 3, Demand: 21},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("CheckServers: %+v, want %+v", got, want)
	}
	if _, err := rp.onReplica.Exec(context.Background(), "select 1"); err != nil { // the admin connection stays usable
		t.Fatal(err)
	}
}

// testClassAndSQL checks the two other ways to a replica: a class named in
// Replicas.Classes, and database/sql (tenantsql) with a ReadOnly context.
func (rp *replicaPair) testClassAndSQL(t *testing.T) {
	p := rp.pool(t, 4, 4, tenantdb.Config{Classes: map[string]tenantdb.Class{"reports": {MaxConns: 1}, "batch": {MaxConns: 1}}},
		tenantdb.Replicas{MaxLag: 2 * time.Second, ProbeEvery: 50 * time.Millisecond, Classes: []string{"reports"}})
	waitUsable(t, p, true, "the replica is probed caught up")
	ctx := tenantdb.WithTenant(context.Background(), "acme")
	db := tenantsql.OpenDB(p)
	defer db.Close()
	for _, c := range []struct {
		what, want string
		run        func() (string, error)
	}{
		{"class reports", "replica", func() (server string, err error) {
			err = p.QueryRow(tenantdb.WithClass(ctx, "reports"), "select current_setting('cluster_name')").Scan(&server)
			return
		}},
		{"class batch", "primary", func() (server string, err error) {
			err = p.QueryRow(tenantdb.WithClass(ctx, "batch"), "select current_setting('cluster_name')").Scan(&server)
			return
		}},
		{"database/sql, ReadOnly", "replica", func() (server string, err error) {
			err = db.QueryRowContext(tenantdb.ReadOnly(ctx), "select current_setting('cluster_name')").Scan(&server)
			return
		}},
		{"database/sql, unmarked", "primary", func() (server string, err error) {
			err = db.QueryRowContext(ctx, "select current_setting('cluster_name')").Scan(&server)
			return
		}},
	} {
		if server, err := c.run(); err != nil || server != c.want {
			t.Errorf("%s: ran on %q (%v), want the %s", c.what, server, err, c.want)
		}
	}
}

// testProbeBudgetFull holds the primary's whole budget with two long
// statements: the probe goes on comparing positions (20 probes), and the
// replica stays within MaxLag.
func (rp *replicaPair) testProbeBudgetFull(t *testing.T) {
	const maxLag = 500 * time.Millisecond
	p := rp.pool(t, 2, 2, tenantdb.Config{}, tenantdb.Replicas{MaxLag: maxLag, ProbeEvery: 50 * time.Millisecond})
	waitUsable(t, p, true, "the replica is probed caught up")
	ctx, cancel := context.WithCancel(tenantdb.WithTenant(context.Background(), "acme"))
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range 2 { // the budget, and the plan's cap
		wg.Go(func() { _, _ = p.Exec(ctx, "select pg_sleep(60) /* budget */") })
	}
	tenantdbtest.Eventually(t, time.Minute, "the two statements hold the primary's budget", func() bool {
		var n int
		err := rp.onPrimary.QueryRow(context.Background(), "select count(*) from pg_stat_activity "+
			"where application_name = $1 and query like '%budget%' and state = 'active'", replicaApp).Scan(&n)
		return err == nil && n == 2
	})
	from := replicaStat(p).Probes
	most := time.Duration(0)
	tenantdbtest.Eventually(t, time.Minute, "20 probes", func() bool {
		s := replicaStat(p)
		most = max(most, s.Lag)
		return s.Probes >= from+20
	})
	if s := replicaStat(p); !s.Usable || most > maxLag {
		t.Errorf("with the primary's budget held: replica %+v, most lag seen %v: want it usable within MaxLag %v", s, most, maxLag)
	}
}
