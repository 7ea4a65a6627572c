package tenantdb_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// terminate kills, from outside the pool, the backend running a query that
// carries marker, once it is running.
func terminate(t *testing.T, marker string) {
	t.Helper()
	eventually(t, "the query runs", func() bool { return terminateBackends(t, marker) > 0 })
}

func TestKilledBackendReleasesItsSlot(t *testing.T) {
	p := newPool(t, sharedPG, 4, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 2}}})
	ctx := as("victim")

	t.Run("mid-query", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			_, err := p.Exec(ctx, "select pg_sleep(30) /* kill-exec */")
			done <- err
		}()
		terminate(t, "kill-exec")
		if err := <-done; err == nil {
			t.Fatal("the killed query succeeded")
		}
		assertInUse(t, p, "victim", 0, "after the backend was killed")
	})
	t.Run("in a transaction", func(t *testing.T) {
		tx, err := p.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "select 1 /* kill-tx */"); err != nil {
			t.Fatal(err)
		}
		terminate(t, "kill-tx") // idle in transaction: its last query carries the marker
		if _, err := tx.Exec(ctx, "select 1"); err == nil {
			t.Fatal("a query on a killed connection succeeded")
		}
		assertInUse(t, p, "victim", 1, "a dead transaction still holds until rolled back")
		_ = tx.Rollback(ctx)
		assertInUse(t, p, "victim", 0, "dead transaction rolled back")
	})
	t.Run("while reading rows", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			rows, err := p.Query(ctx, "select pg_sleep(30)::text /* kill-rows */")
			if err != nil {
				done <- err
				return
			}
			for rows.Next() {
			}
			done <- rows.Err()
		}()
		terminate(t, "kill-rows")
		if err := <-done; err == nil {
			t.Fatal("rows from a killed backend ended without error")
		}
		assertInUse(t, p, "victim", 0, "rows of a killed backend")
	})
	// The pool serves again on fresh connections.
	var n int
	if err := p.QueryRow(ctx, "select 1").Scan(&n); err != nil || n != 1 {
		t.Fatal(n, err)
	}
	assertNothingHeld(t, p)
}

func TestOneDeadlineCoversEveryWait(t *testing.T) {
	p := newPool(t, sharedPG, 2, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1, MaxWaiting: 5}}})
	deadline := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(as("acme"), 100*time.Millisecond)
	}
	t.Run("the query", func(t *testing.T) {
		ctx, cancel := deadline()
		defer cancel()
		_, err := p.Exec(ctx, "select pg_sleep(5)")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want DeadlineExceeded", err)
		}
	})
	t.Run("the tenant's queue", func(t *testing.T) {
		tx, err := p.Begin(as("acme")) // holds acme's only slot
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		ctx, cancel := deadline()
		defer cancel()
		_, err = p.Exec(ctx, "select 1")
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, tenantdb.ErrOverLimit) {
			t.Fatalf("err = %v, want DeadlineExceeded (not an over-limit rejection)", err)
		}
	})
	t.Run("the shared pool", func(t *testing.T) {
		a, err := p.Begin(as("a"))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Rollback(context.Background())
		b, err := p.Begin(as("b"))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Rollback(context.Background())
		ctx, cancel := deadline()
		defer cancel()
		_, err = p.Exec(ctx, "select 1") // acme is within its cap; both connections are taken
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want DeadlineExceeded", err)
		}
	})
	if s := p.TenantStat("acme"); s.TimedOut != 2 {
		t.Errorf("acme TimedOut = %d, want 2 (the queue and the shared pool)", s.TimedOut)
	}
}

func TestCancellationStormLeavesNothingHeld(t *testing.T) {
	p := newPool(t, sharedPG, 8, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 4, MaxWaiting: 60}}})
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			ctx, cancel := context.WithCancel(as([]string{"a", "b", "c"}[i%3]))
			defer cancel()
			if i%2 == 0 { // half are cancelled at a random moment
				go func() {
					time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
					cancel()
				}()
			}
			var err error
			switch i % 4 {
			case 0:
				_, err = p.Exec(ctx, "select pg_sleep(0.005)")
			case 1:
				var rows pgx.Rows
				if rows, err = p.Query(ctx, "select pg_sleep(0.01), generate_series(1, 10)"); err == nil {
					for rows.Next() {
					}
					rows.Close()
					err = rows.Err()
				}
			case 2:
				err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "select pg_sleep(0.01)")
					return err
				})
			case 3:
				err = p.AcquireFunc(ctx, func(c tenantdb.Conn) error {
					_, err := c.Exec(ctx, "select pg_sleep(0.01)")
					return err
				})
			}
			if err == nil {
				ok.Add(1)
			} else {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d succeeded, %d failed", ok.Load(), failed.Load())
	if failed.Load() == 0 || ok.Load() == 0 {
		t.Fatal("the storm should both cancel calls and let some finish")
	}
	assertNothingHeld(t, p)
	if _, err := p.Exec(as("a"), "select 1"); err != nil {
		t.Fatal(err)
	}
}

func TestPostgresRestartMidLoad(t *testing.T) {
	pg := tenantdbtest.StartPostgres(t)
	p := newPool(t, pg, 8, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 4, MaxWaiting: 8}}})
	const callDeadline = time.Second
	var (
		stopLoad              = make(chan struct{})
		wg                    sync.WaitGroup
		succeeded, failed     atomic.Int64
		slowest               atomic.Int64
		succeededAfterRestart atomic.Bool
		restarted             atomic.Bool
	)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stopLoad:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(as([]string{"a", "b"}[i%2]), callDeadline)
				start := time.Now()
				_, err := p.Exec(ctx, "select pg_sleep(0.01)")
				cancel()
				if d := int64(time.Since(start)); d > slowest.Load() {
					slowest.Store(d)
				}
				if err != nil {
					failed.Add(1)
					time.Sleep(5 * time.Millisecond) // a client's back-off
				} else {
					succeeded.Add(1)
					if restarted.Load() {
						succeededAfterRestart.Store(true)
					}
				}
			}
		}()
	}
	eventually(t, "load runs", func() bool { return succeeded.Load() > 50 })
	if err := pg.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	failedBefore := failed.Load()
	eventually(t, "calls fail while the server is down", func() bool { return failed.Load() > failedBefore+20 })
	if err := pg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted.Store(true)
	eventually(t, "the pool serves again", succeededAfterRestart.Load)
	close(stopLoad)
	wg.Wait()

	t.Logf("%d succeeded, %d failed, slowest call %v", succeeded.Load(), failed.Load(), time.Duration(slowest.Load()))
	if s := time.Duration(slowest.Load()); s > 2*callDeadline {
		t.Errorf("a call took %v, hanging past its %v deadline", s, callDeadline)
	}
	assertNothingHeld(t, p)
}
