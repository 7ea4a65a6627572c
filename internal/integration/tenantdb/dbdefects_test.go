package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/internal/pgtest"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// The tests of issue 51's holes in Config.Database run on sharedPG, in
// databases of their own, as login roles of their own (so that the server's
// count of a role's backends is the Pool's).

// defectDatabases creates the databases names on sharedPG unless they exist,
// and returns a superuser connection to it.
func defectDatabases(t *testing.T, names ...string) *pgx.Conn {
	t.Helper()
	admin := adminConn(t, sharedPG.DSN)
	create := databaseCreator(t, admin)
	for _, name := range names {
		create(name, "create database "+name)
	}
	return admin
}

// loginAs returns a pgxpool.Config of budget connections to sharedPG as
// role, an ordinary login role created unless it exists.
func loginAs(t *testing.T, role string, budget int32) *pgxpool.Config {
	t.Helper()
	return pgxConfigOn(t, pgtest.AppRole(t, sharedPG.DSN, role, ""), budget)
}

// roleBackends counts, on conn's server, the client backends of role that
// match where (SQL after "and", or "").
func roleBackends(ctx context.Context, conn *pgx.Conn, role, where string) (n int, err error) {
	q := "select count(*) from pg_stat_activity where usename = $1 and backend_type = 'client backend'"
	if where != "" {
		q += " and " + where
	}
	err = conn.QueryRow(ctx, q, role).Scan(&n)
	return n, err
}

// TestDatabaseBudgetWaitIsNotCached: a connect that timed out (connect_timeout)
// waiting for room in the budget is no failure of the database: the next
// call to that database, once room can be made from idle connections, is
// served, not failed with the first call's error (issue 51, item 7).
func TestDatabaseBudgetWaitIsNotCached(t *testing.T) {
	const db = "tenantdb_defects_wait"
	defectDatabases(t, db)
	pcfg := loginAs(t, "tenantdb_defects_wait_app", 2)
	pcfg.ConnConfig.ConnectTimeout = 5 * time.Second // also bounds the login of y, on a loaded machine
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:    map[string]tenantdb.Plan{"p": {MaxConns: 2}},
		Database: func(string) (string, error) { return db, nil },
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// The template database's connections, taken outside the gate, spend
	// the budget.
	ctx := context.Background()
	var held []*pgxpool.Conn
	for range 2 {
		c, err := p.Pgxpool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	_, err = p.Exec(as("x"), "select 1")
	if err == nil {
		t.Fatal("x connected with the budget spent")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("x's wait for room: %v, want an error matching context.DeadlineExceeded (connect_timeout)", err)
	}
	for _, c := range held {
		c.Release() // idle now: room can be made from them
	}
	var got string
	if err := p.QueryRow(as("y"), "select current_database()").Scan(&got); err != nil || got != db {
		t.Fatalf("y's call after x's wait for room timed out, with idle connections to close: %q, %v; want it served in %s",
			got, err, db)
	}
	if st := p.DatabasesStat(); st.Open > 2 {
		t.Fatalf("%+v: over the budget", st)
	}
	assertNothingHeld(t, p)
}

// TestDatabaseBudgetHoldsThroughCancels is issue 51's item 2: tenant a's
// long statements have their contexts end while they hold the whole budget
// (2), in three rounds, and tenant b's call, in another database, wants a
// connection at that moment. pgx closes a's connections and sends a cancel
// request for each: the cancel request must go out at once (it needs no
// room: the server counts no connection for it), the statements must end
// on the server, and a's rooms must come back only when their server
// processes have ended. The server's count of the login role's backends,
// sampled throughout, never exceeds the budget, and b waits for no more
// than the cancels take: its wait is compared with a reference measured
// here, a cancelled statement's end on a connection of its own plus a
// connect.
func TestDatabaseBudgetHoldsThroughCancels(t *testing.T) {
	const (
		role   = "tenantdb_defects_budget_app"
		budget = 2
		sleep  = "select pg_sleep(300)"
	)
	admin := defectDatabases(t, "tenantdb_defects_a", "tenantdb_defects_b")
	pcfg := loginAs(t, role, budget)
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:    map[string]tenantdb.Plan{"p": {MaxConns: budget, MaxWaiting: tenantdb.Unbounded}},
		Database: func(tenant string) (string, error) { return "tenantdb_defects_" + tenant, nil },
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	sleeping := func() int {
		t.Helper()
		n, err := roleBackends(ctx, admin, role, "state = 'active' and query = '"+sleep+"'")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The reference: a statement cancelled through its context on a
	// connection of its own (as the superuser: not counted) until its
	// process has ended, and a connect.
	start := time.Now()
	own, err := pgx.Connect(ctx, sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	var ownPID int
	if err := own.QueryRow(ctx, "select pg_backend_pid()").Scan(&ownPID); err != nil {
		t.Fatal(err)
	}
	connect := time.Since(start)
	refCtx, cancelRef := context.WithCancel(ctx)
	refDone := make(chan error, 1)
	go func() { _, err := own.Exec(refCtx, sleep); refDone <- err }()
	eventually(t, "the reference statement running", func() bool {
		var n int
		_ = admin.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1 and state = 'active'", ownPID).Scan(&n)
		return n == 1
	})
	start = time.Now()
	cancelRef()
	<-refDone
	eventually(t, "the reference statement's process ended", func() bool {
		var n int
		_ = admin.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1", ownPID).Scan(&n)
		return n == 0
	})
	reference := time.Since(start) + connect

	// The server's count of the role's backends, throughout.
	sampler, err := pgx.Connect(ctx, sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer sampler.Close(ctx)
	var most, samples atomic.Int64
	stop, sampled := make(chan struct{}), make(chan struct{})
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
			n, err := roleBackends(ctx, sampler, role, "")
			if err != nil {
				t.Error(err)
				return
			}
			samples.Add(1)
			if int64(n) > most.Load() {
				most.Store(int64(n))
			}
		}
	}()
	defer func() {
		close(stop)
		<-sampled
		t.Logf("the server counted at most %d of the role's backends in %d samples, budget %d", most.Load(), samples.Load(), budget)
		if most.Load() > budget {
			t.Errorf("the server counted %d of the role's backends, over the budget of %d", most.Load(), budget)
		}
	}()

	var waits []time.Duration
	for round := range 3 {
		actx, cancel := context.WithCancel(as("a"))
		var statements sync.WaitGroup
		for range budget {
			statements.Go(func() {
				if _, err := p.Exec(actx, sleep); !errors.Is(err, context.Canceled) {
					t.Errorf("round %d: a's statement: %v, want context.Canceled", round, err)
				}
			})
		}
		eventually(t, "a's statements running on the whole budget", func() bool { return sleeping() == budget })
		bctx, bcancel := context.WithTimeout(as("b"), time.Minute)
		start := time.Now()
		cancel()
		var got string
		err := p.QueryRow(bctx, "select current_database()").Scan(&got)
		wait := time.Since(start)
		bcancel()
		statements.Wait()
		if err != nil || got != "tenantdb_defects_b" {
			t.Fatalf("round %d: b's call: %q, %v", round, got, err)
		}
		waits = append(waits, wait)
		// a's statements were cancelled on the server, not left to run
		// their 300 s.
		eventually(t, "a's statements ended on the server", func() bool { return sleeping() == 0 })
	}
	t.Logf("b's call as a's statements were cancelled: %v; reference (a cancelled statement's end and a connect) %v",
		waits, reference)
	for round, wait := range waits {
		if wait > 10*reference {
			t.Errorf("round %d: b waited %v for a connection, over 10x the reference %v", round, wait, reference)
		}
	}
	if st := p.DatabasesStat(); st.Open > budget {
		t.Errorf("%+v: over the budget", st)
	}
	assertNothingHeld(t, p)
}

// TestDatabaseBudgetFallbackDials: a connect that dials more than once (a
// first host that refuses, then sslmode=prefer's attempt with TLS, which
// this server refuses, before the one without) takes room for each dial
// and gives back that of each failed one: the calls are served within the
// budget, and once every connection is closed no room stays taken.
func TestDatabaseBudgetFallbackDials(t *testing.T) {
	const (
		role   = "tenantdb_defects_fallback_app"
		budget = 2
	)
	admin := defectDatabases(t, "tenantdb_defects_a", "tenantdb_defects_b")
	u, err := url.Parse(pgtest.AppRole(t, sharedPG.DSN, role, ""))
	if err != nil {
		t.Fatal(err)
	}
	var ssl string
	if err := admin.QueryRow(context.Background(), "show ssl").Scan(&ssl); err != nil {
		t.Fatal(err)
	}
	t.Logf("the server's ssl: %s (off: sslmode=prefer's TLS attempt is refused and a dial without TLS follows)", ssl)
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused.Close() // its port refuses connections now
	password, _ := u.User.Password()
	pcfg, err := pgxpool.ParseConfig(fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%s user=%s password=%s dbname=%s sslmode=prefer",
		refused.Addr().(*net.TCPAddr).Port, u.Port(), role, password, strings.TrimPrefix(u.Path, "/")))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = budget
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:    map[string]tenantdb.Plan{"p": {MaxConns: budget, MaxWaiting: tenantdb.Unbounded}},
		Database: func(tenant string) (string, error) { return "tenantdb_defects_" + tenant, nil },
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ours := func() int {
		t.Helper()
		n, err := roleBackends(context.Background(), admin, role, "")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var calls sync.WaitGroup
	for i := range 8 {
		calls.Go(func() {
			tenant := []string{"a", "b"}[i%2]
			var got string
			if err := p.QueryRow(as(tenant), "select current_database()").Scan(&got); err != nil || got != "tenantdb_defects_"+tenant {
				t.Errorf("%s: %q, %v", tenant, got, err)
			}
		})
	}
	calls.Wait()
	if st, n := p.DatabasesStat(), ours(); st.Open > budget || n > budget || st.Opens < 2 {
		t.Fatalf("%+v, the server counts %d: want an open per database, within the budget %d", st, n, budget)
	}
	p.Reset()
	eventually(t, "every room back once every connection closed", func() bool { return p.DatabasesStat().Open == 0 })
	if n := ours(); n != 0 {
		t.Fatalf("the server still counts %d of the role's backends with no room taken", n)
	}
	assertNothingHeld(t, p)
}
