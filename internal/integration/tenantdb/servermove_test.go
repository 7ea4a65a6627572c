package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantsql"
)

// testMoveUnderLoad moves a tenant from s0 to s1 while it sends 50 calls a
// second of 20 ms statements, each with a deadline well beyond the move's
// pause, and checks from the servers' side: no call failed, no statement
// of the tenant ran on s0 after the fence (each row stamped by the server's
// clock, the fence read from s0's clock in the cutover), and the calls
// after the move ran on s1.
func (f *fleet) testMoveUnderLoad(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"s0", "s1"} {
		if _, err := f.admins[name].Exec(ctx,
			"create table if not exists moved (tenant text, at timestamptz default clock_timestamp())"); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	at := tenantdb.Placement{Server: "s0"}
	p := f.pool(t, 10, tenantdb.Config{
		Plans:     map[string]tenantdb.Plan{"p": {MaxConns: 4, MaxWaiting: tenantdb.Unbounded}},
		LookupTTL: 50 * time.Millisecond, // the directory is asked again often
		Placement: func(context.Context, string) (tenantdb.Placement, error) {
			mu.Lock()
			defer mu.Unlock()
			return at, nil
		},
	})
	const rate, duration = 50, 3 * time.Second
	const stmt = "insert into moved (tenant) select 'mover' from pg_sleep(0.02) returning current_setting('cluster_name')"
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	var slowest atomic.Int64
	tick := time.NewTicker(time.Second / rate) // the load's rate, not synchronisation
	defer tick.Stop()
	moved := make(chan error, 1)
	var fence time.Time
	var pause time.Duration
	start := time.Now()
	for i := 0; time.Since(start) < duration; i++ {
		<-tick.C
		if i == rate/2 { // half a second in
			go func() {
				began := time.Now()
				err := p.Move(ctx, "mover", tenantdb.Placement{Server: "s1"}, time.Second, func(ctx context.Context) error {
					if err := f.admins["s0"].QueryRow(ctx, "select clock_timestamp()").Scan(&fence); err != nil {
						return err
					}
					mu.Lock()
					at = tenantdb.Placement{Server: "s1"}
					mu.Unlock()
					return nil
				})
				pause = time.Since(began)
				moved <- err
			}()
		}
		wg.Go(func() {
			callCtx, cancel := context.WithTimeout(as("mover"), 10*time.Second)
			defer cancel()
			began := time.Now()
			var server string
			if err := p.QueryRow(callCtx, stmt).Scan(&server); err != nil {
				failed.Add(1)
				t.Errorf("call %d: %v", i, err)
				return
			}
			took := int64(time.Since(began))
			for old := slowest.Load(); took > old && !slowest.CompareAndSwap(old, took); old = slowest.Load() {
			}
			ok.Add(1)
		})
	}
	wg.Wait()
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	var late, onS0, onS1 int
	if err := f.admins["s0"].QueryRow(ctx,
		"select count(*) filter (where at > $1), count(*) from moved where tenant = 'mover'", fence).Scan(&late, &onS0); err != nil {
		t.Fatal(err)
	}
	if err := f.admins["s1"].QueryRow(ctx, "select count(*) from moved where tenant = 'mover'").Scan(&onS1); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d calls served, %d failed; the move took %v; the slowest call %v; %d rows on s0, %d on s1",
		ok.Load(), failed.Load(), pause.Round(time.Millisecond), time.Duration(slowest.Load()).Round(time.Millisecond), onS0, onS1)
	if late != 0 {
		t.Errorf("%d statements of the tenant ran on s0 after the fence", late)
	}
	if int64(onS0+onS1) != ok.Load() || onS0 == 0 || onS1 == 0 {
		t.Errorf("%d rows on s0 and %d on s1 for %d calls served: want every call's row, on both sides of the move",
			onS0, onS1, ok.Load())
	}
	for _, name := range []string{"s0", "s1"} {
		if _, err := f.admins[name].Exec(ctx, "drop table moved"); err != nil {
			t.Error(err)
		}
	}
	assertNothingHeld(t, p)
}

// testMoveEndsLongCalls moves a tenant whose call outlasts the grace: the
// call fails with ErrMoved, its statement cancelled on the server, and the
// move completes.
func (f *fleet) testMoveEndsLongCalls(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	at := tenantdb.Placement{Server: "s2"}
	p := f.pool(t, 4, tenantdb.Config{
		Placement: func(context.Context, string) (tenantdb.Placement, error) {
			mu.Lock()
			defer mu.Unlock()
			return at, nil
		},
	})
	long := make(chan error, 1)
	go func() { _, err := p.Exec(as("sleeper"), "select pg_sleep(60)"); long <- err }()
	eventually(t, "the long statement runs on s2", func() bool {
		var n int
		_ = f.admins["s2"].QueryRow(ctx, "select count(*) from pg_stat_activity where query = 'select pg_sleep(60)'").Scan(&n)
		return n == 1
	})
	err := p.Move(ctx, "sleeper", tenantdb.Placement{Server: "s0"}, 10*time.Millisecond, func(context.Context) error {
		var n int
		if err := f.admins["s2"].QueryRow(ctx, "select count(*) from pg_stat_activity where query = 'select pg_sleep(60)'").Scan(&n); err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("at the fence, s2 still runs %d of the tenant's statements", n)
		}
		mu.Lock()
		at = tenantdb.Placement{Server: "s0"}
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-long; !errors.Is(err, tenantdb.ErrMoved) {
		t.Fatalf("the long call: %v, want ErrMoved", err)
	}
	var server string
	if err := p.QueryRow(as("sleeper"), "select current_setting('cluster_name')").Scan(&server); err != nil || server != "s0" {
		t.Fatalf("after the move: %q, %v; want s0", server, err)
	}
	assertNothingHeld(t, p)
}

// testMoveEndsEveryPath moves a tenant whose one-minute statements run on
// every path that holds a connection (the Pool's Exec and SendBatch,
// database/sql through tenantsql, a Tx's Exec and QueryRow, a savepoint of
// a Tx, and an acquired Conn) with a 10 ms grace: each call fails
// with an error matching ErrMoved, and so does the next statement of the Tx
// and of the Conn (the isolation checker's servers configuration found
// tenantsql's, the Tx's and the Conn's failing with ErrRevoked, as if a
// cluster lease had been revoked, and a batch's result, a Tx's QueryRow
// and a savepoint's statement with the bare 57014 of the cancel).
func (f *fleet) testMoveEndsEveryPath(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	at := tenantdb.Placement{Server: "s2"}
	p := f.pool(t, 8, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"p": {MaxConns: 7, MaxWaiting: tenantdb.Unbounded}},
		Placement: func(context.Context, string) (tenantdb.Placement, error) {
			mu.Lock()
			defer mu.Unlock()
			return at, nil
		},
	})
	db := tenantsql.OpenDB(p)
	defer db.Close()
	const long = "select pg_sleep(60)"
	calls := map[string]func() []error{
		"Pool.Exec": func() []error { _, err := p.Exec(as("mover"), long); return []error{err} },
		"tenantsql": func() []error { _, err := db.ExecContext(as("mover"), long); return []error{err} },
		"SendBatch": func() []error {
			b := &pgx.Batch{}
			b.Queue(long)
			br := p.SendBatch(as("mover"), b)
			_, err := br.Exec()
			return []error{err, br.Close()}
		},
		"Tx": func() []error {
			tx, err := p.Begin(as("mover"))
			if err != nil {
				return []error{err}
			}
			defer tx.Rollback(ctx)
			_, err = tx.Exec(ctx, long)
			_, next := tx.Exec(ctx, "select 1")
			return []error{err, next}
		},
		"Tx.QueryRow": func() []error {
			tx, err := p.Begin(as("mover"))
			if err != nil {
				return []error{err}
			}
			defer tx.Rollback(ctx)
			return []error{tx.QueryRow(ctx, long).Scan(nil)}
		},
		"Tx savepoint": func() []error {
			return []error{pgx.BeginFunc(as("mover"), p, func(tx pgx.Tx) error {
				return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
					_, err := sp.Exec(ctx, long)
					return err
				})
			})}
		},
		"Conn": func() []error {
			c, err := p.Acquire(as("mover"))
			if err != nil {
				return []error{err}
			}
			defer c.Release()
			_, err = c.Exec(ctx, long)
			_, next := c.Exec(ctx, "select 1")
			return []error{err, next}
		},
	}
	results := map[string]chan []error{}
	for name, call := range calls {
		ch := make(chan []error, 1)
		results[name] = ch
		go func() { ch <- call() }()
	}
	eventually(t, "the long statements run on s2", func() bool {
		var n int
		_ = f.admins["s2"].QueryRow(ctx, "select count(*) from pg_stat_activity where query = $1", long).Scan(&n)
		return n == len(calls)
	})
	err := p.Move(ctx, "mover", tenantdb.Placement{Server: "s0"}, 10*time.Millisecond, func(context.Context) error {
		mu.Lock()
		at = tenantdb.Placement{Server: "s0"}
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, ch := range results {
		for i, err := range <-ch {
			if !errors.Is(err, tenantdb.ErrMoved) {
				t.Errorf("%s, statement %d: %v, want ErrMoved", name, i+1, err)
			}
		}
	}
	assertNothingHeld(t, p)
}

// testMoveAwaitsConnects moves a tenant whose only call gave up while its
// connection was still opening on s2: pgxpool goes on with the connect, and
// its session setup (AfterConnect, here held until the tenant is seen
// drained) runs on s2. The cut-over must come after it: the isolation
// checker's servers configuration saw tenantdb's own check of a new session
// running on the old server at the cut-over.
func (f *fleet) testMoveAwaitsConnects(t *testing.T) {
	ctx := context.Background()
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var setupDone atomic.Bool
	var mu sync.Mutex
	at := tenantdb.Placement{Server: "s2"}
	p := f.poolWith(t, 4, tenantdb.Config{
		Placement: func(context.Context, string) (tenantdb.Placement, error) {
			mu.Lock()
			defer mu.Unlock()
			return at, nil
		},
	}, func(name string, c *pgxpool.Config) {
		if name != "s2" {
			return
		}
		c.AfterConnect = func(context.Context, *pgx.Conn) error {
			first := false
			once.Do(func() { first = true })
			if first {
				close(entered)
				<-release
				setupDone.Store(true)
			}
			return nil
		}
	})
	cctx, cancel := context.WithCancel(as("opener"))
	errc := make(chan error, 1)
	go func() { _, err := p.Exec(cctx, "select 1"); errc <- err }()
	<-entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the call: %v, want context.Canceled", err)
	}
	moved := make(chan struct{})
	go func() {
		defer close(release)
		tick := time.NewTicker(time.Millisecond) // polling the Pool's stats
		defer tick.Stop()
		for p.TenantStat("opener").EffectiveLimit != 0 { // drained: the move waits
			select {
			case <-moved:
				return
			case <-tick.C:
			}
		}
	}()
	err := p.Move(ctx, "opener", tenantdb.Placement{Server: "s0"}, 10*time.Millisecond, func(context.Context) error {
		if !setupDone.Load() {
			return errors.New("at the cut-over, the connect of the ended call still runs its setup on s2")
		}
		mu.Lock()
		at = tenantdb.Placement{Server: "s0"}
		mu.Unlock()
		return nil
	})
	close(moved)
	if err != nil {
		t.Fatal(err)
	}
	assertNothingHeld(t, p)
}
