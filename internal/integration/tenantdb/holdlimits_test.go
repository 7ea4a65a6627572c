package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// holdLimitsPool is a Pool of one shared connection whose "limited" plan
// (cap 1, rejecting over it) has the given limits; tenant "other" is on a
// plan without them.
func holdLimitsPool(t *testing.T, idle, maxHold time.Duration) *tenantdb.Pool {
	t.Helper()
	return newPool(t, sharedPG, 1, tenantdb.Config{
		Plans: map[string]pool.Plan{
			"limited": {MaxConns: 1, IdleInTransactionTimeout: idle, MaxHold: maxHold},
			"plain":   {MaxConns: 1, MaxWaiting: 10},
		},
		DefaultPlan: "plain",
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			if id == "other" {
				return pool.Tenant{}, nil
			}
			return pool.Tenant{Plan: "limited"}, nil
		},
	})
}

// holdTable creates a table of its own for a test, dropped at its end.
func holdTable(t *testing.T, name string) {
	t.Helper()
	raw := rawPool(t, sharedPG, 1)
	if _, err := raw.Exec(context.Background(), fmt.Sprintf("drop table if exists %[1]s; create table %[1]s (x int)", name)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = raw.Exec(context.Background(), "drop table if exists "+name) })
}

// sessionAlive reports whether the server still has the backend pid.
func sessionAlive(t *testing.T, pid uint32) bool {
	t.Helper()
	var n int
	if err := rawPool(t, sharedPG, 1).QueryRow(context.Background(),
		"select count(*) from pg_stat_activity where pid = $1", pid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// roundTrip measures the median time of one select on p, the reference
// the latency bounds below are stated in.
func roundTrip(t *testing.T, p *tenantdb.Pool, tenant string) time.Duration {
	t.Helper()
	var times []time.Duration
	for range 9 {
		began := time.Now()
		if _, err := p.Exec(as(tenant), "select 1"); err != nil {
			t.Fatal(err)
		}
		times = append(times, time.Since(began))
	}
	for i := range times {
		for j := i + 1; j < len(times); j++ {
			if times[j] < times[i] {
				times[i], times[j] = times[j], times[i]
			}
		}
	}
	return times[len(times)/2]
}

// TestIdleTransactionEnded: a Tx whose holder sends nothing for its
// plan's IdleInTransactionTimeout is rolled back and its slot and
// connection returned, no sooner than the timeout and before twice it
// (plus round trips); the server session stays (the same backend serves the next
// call, and the pool opened no other connection); the tenant at its cap
// gets in again; every later use of the Tx, Commit and Rollback included,
// fails with ErrIdleInTransaction (and pgx.ErrTxClosed), and the
// transaction's insert is gone.
func TestIdleTransactionEnded(t *testing.T) {
	const idle = 500 * time.Millisecond
	holdTable(t, "hold_idle")
	p := holdLimitsPool(t, idle, 0)
	rtt := roundTrip(t, p, "a")

	tx, err := p.Begin(as("a"))
	if err != nil {
		t.Fatal(err)
	}
	var pid uint32
	if err := tx.QueryRow(as("a"), "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(as("a"), "insert into hold_idle values (1)"); err != nil {
		t.Fatal(err)
	}
	lastSent := time.Now()
	if _, err := p.Exec(as("a"), "select 1"); !errors.Is(err, tenantdb.ErrOverLimit) {
		t.Fatalf("tenant a at its cap of 1 while its transaction is open: %v, want ErrOverLimit", err)
	}
	eventually(t, "the idle transaction's slot is back", func() bool { return p.TenantStat("a").InUse == 0 })
	endedAfter := time.Since(lastSent)
	// Generous for a loaded machine: the timer's lateness (up to the
	// timeout again), and a rollback of a few round trips. The numbers are
	// in bench/results/budgets.md.
	bound := 2*idle + 20*rtt
	t.Logf("idle %v: ended %v after the last statement (round trip %v, bound %v)", idle, endedAfter.Round(time.Millisecond), rtt, bound)
	if endedAfter < idle {
		t.Errorf("ended %v after the last statement, before its IdleInTransactionTimeout %v", endedAfter, idle)
	}
	if endedAfter > bound {
		t.Errorf("ended %v after the last statement, want within %v", endedAfter, bound)
	}

	// The slot is back: the tenant at its cap gets in, on the same session.
	var next uint32
	if err := p.QueryRow(as("a"), "select pg_backend_pid()").Scan(&next); err != nil {
		t.Fatalf("tenant a after its idle transaction ended: %v", err)
	}
	if next != pid || !sessionAlive(t, pid) {
		t.Errorf("backend %d after the end, %d before (alive: %v): the end cost a server session", next, pid, sessionAlive(t, pid))
	}
	if n := p.Pgxpool().Stat().NewConnsCount(); n != 1 {
		t.Errorf("the pool opened %d connections, want 1: the ended one was destroyed", n)
	}
	var rows int
	if err := p.QueryRow(as("other"), "select count(*) from hold_idle").Scan(&rows); err != nil || rows != 0 {
		t.Errorf("rows left by the ended transaction: %d (%v), want 0: it was not rolled back", rows, err)
	}

	ended := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, tenantdb.ErrIdleInTransaction) || !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("%s after the end: %v, want ErrIdleInTransaction and pgx.ErrTxClosed", what, err)
		}
	}
	_, err = tx.Exec(as("a"), "select 1")
	ended("Exec", err)
	_, err = tx.Query(as("a"), "select 1")
	ended("Query", err)
	ended("QueryRow", tx.QueryRow(as("a"), "select 1").Scan(new(int)))
	_, err = tx.Begin(as("a"))
	ended("Begin", err)
	ended("Commit", tx.Commit(as("a")))
	ended("Rollback", tx.Rollback(as("a")))
	if s := p.TenantStat("a"); s.IdleTimeouts != 1 || s.HoldTimeouts != 0 {
		t.Errorf("TenantStat: %d idle and %d hold timeouts, want 1 and 0", s.IdleTimeouts, s.HoldTimeouts)
	}
	assertNothingHeld(t, p)
}

// TestWorkingTransactionNotEnded: a Tx that keeps working, with pauses
// shorter than its IdleInTransactionTimeout, and a statement that runs
// longer than it, is not ended: it commits, well past the timeout.
func TestWorkingTransactionNotEnded(t *testing.T) {
	// Pauses of a tenth of the timeout: a loaded machine's lateness to
	// wake from them stays far below it.
	const idle = time.Second
	holdTable(t, "hold_working")
	p := holdLimitsPool(t, idle, 0)
	tx, err := p.Begin(as("a"))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	for i := range 12 { // 1.2 s of work in all, past the timeout
		if _, err := tx.Exec(as("a"), "insert into hold_working values ($1)", i); err != nil {
			t.Fatalf("statement %d of a working transaction: %v", i, err)
		}
		time.Sleep(idle / 10) // the holder's own think time, not synchronisation
	}
	// A statement longer than the timeout: busy, not idle.
	if _, err := tx.Exec(as("a"), "select pg_sleep($1::float8)", (3 * idle / 2).Seconds()); err != nil {
		t.Fatalf("a statement longer than the idle timeout: %v", err)
	}
	// Rows read slowly: busy until they are done.
	rows, err := tx.Query(as("a"), "select x from hold_working")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		time.Sleep(idle / 8) // 1.5 s for the 12 rows: longer than the timeout in all
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatalf("rows read slowly: %v", err)
	}
	if err := tx.Commit(as("a")); err != nil {
		t.Fatalf("commit of a transaction that kept working for %v under a %v idle timeout: %v", time.Since(began), idle, err)
	}
	var n int
	if err := p.QueryRow(as("a"), "select count(*) from hold_working").Scan(&n); err != nil || n != 12 {
		t.Errorf("committed rows: %d (%v), want 12", n, err)
	}
	if s := p.TenantStat("a"); s.IdleTimeouts != 0 {
		t.Errorf("TenantStat: %d idle timeouts, want 0", s.IdleTimeouts)
	}
	assertNothingHeld(t, p)
}

// TestConnMaxHold: a Conn held past its plan's MaxHold is released and its
// transaction rolled back, on the same server session; the slot is back;
// its later uses fail with ErrMaxHold and ErrConnReleased. A statement
// running when MaxHold passes runs to its end, and the Conn ends as it
// returns.
func TestConnMaxHold(t *testing.T) {
	const maxHold = 400 * time.Millisecond
	holdTable(t, "hold_conn")
	p := holdLimitsPool(t, 0, maxHold)
	rtt := roundTrip(t, p, "a")

	t.Run("idle", func(t *testing.T) {
		acquired := time.Now()
		c, err := p.Acquire(as("a"))
		if err != nil {
			t.Fatal(err)
		}
		var pid uint32
		if err := c.QueryRow(as("a"), "select pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		tx, err := c.Begin(as("a"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(as("a"), "insert into hold_conn values (1)"); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the Conn's slot is back", func() bool { return p.TenantStat("a").InUse == 0 })
		endedAfter := time.Since(acquired)
		bound := 2*maxHold + 20*rtt
		t.Logf("MaxHold %v: ended %v after the acquire (round trip %v, bound %v)", maxHold, endedAfter.Round(time.Millisecond), rtt, bound)
		if endedAfter < maxHold || endedAfter > bound {
			t.Errorf("ended %v after the acquire, want from MaxHold %v to %v", endedAfter, maxHold, bound)
		}
		var next uint32
		if err := p.QueryRow(as("a"), "select pg_backend_pid()").Scan(&next); err != nil {
			t.Fatalf("tenant a after its Conn ended: %v", err)
		}
		if next != pid || !sessionAlive(t, pid) {
			t.Errorf("backend %d after the end, %d before: the end cost a server session", next, pid)
		}
		var rows int
		if err := p.QueryRow(as("other"), "select count(*) from hold_conn").Scan(&rows); err != nil || rows != 0 {
			t.Errorf("rows left by the ended Conn's transaction: %d (%v), want 0", rows, err)
		}
		ended := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, tenantdb.ErrMaxHold) || !errors.Is(err, tenantdb.ErrConnReleased) {
				t.Errorf("%s after the end: %v, want ErrMaxHold and ErrConnReleased", what, err)
			}
		}
		_, err = c.Exec(as("a"), "select 1")
		ended("Conn.Exec", err)
		_, err = tx.Exec(as("a"), "select 1")
		ended("its Tx's Exec", err)
		ended("its Tx's Commit", tx.Commit(as("a")))
		if c.Conn() != nil {
			t.Error("Conn.Conn after the end is not nil")
		}
		c.Release() // does nothing
	})

	t.Run("busy", func(t *testing.T) {
		c, err := p.Acquire(as("a"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		began := time.Now()
		if _, err := c.Exec(as("a"), "select pg_sleep($1::float8)", (2 * maxHold).Seconds()); err != nil {
			t.Fatalf("a statement running when MaxHold passed: %v, want it to run to its end", err)
		}
		if d := time.Since(began); d < 2*maxHold {
			t.Errorf("the statement returned after %v, before its %v", d, 2*maxHold)
		}
		if _, err := c.Exec(as("a"), "select 1"); !errors.Is(err, tenantdb.ErrMaxHold) {
			t.Errorf("the next statement: %v, want ErrMaxHold", err)
		}
		if s := p.TenantStat("a"); s.InUse != 0 {
			t.Errorf("tenant a holds %d slots once its Conn ended, want 0", s.InUse)
		}
	})
	if s := p.TenantStat("a"); s.HoldTimeouts != 2 {
		t.Errorf("TenantStat: %d hold timeouts, want 2", s.HoldTimeouts)
	}
	assertNothingHeld(t, p)
}

// TestHoldEndRaces: holders whose pauses straddle a tiny
// IdleInTransactionTimeout, on Txs and Conns, beside a tenant without one
// on the same two connections: every call either works or fails with
// ErrIdleInTransaction (never with pgx's "conn busy", a closed connection
// or another tenant's state), the other tenant never fails, and nothing
// stays held. Run with -race.
func TestHoldEndRaces(t *testing.T) {
	const idle = 5 * time.Millisecond
	p := newPool(t, sharedPG, 2, tenantdb.Config{
		Plans: map[string]pool.Plan{
			"limited": {MaxConns: 2, MaxWaiting: 100, IdleInTransactionTimeout: idle},
			"plain":   {MaxConns: 2, MaxWaiting: 100},
		},
		DefaultPlan: "plain",
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			if id == "other" {
				return pool.Tenant{}, nil
			}
			return pool.Tenant{Plan: "limited"}, nil
		},
	})
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	worked, endedCalls := make([]int, 3), make([]int, 3)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 46))
			for range 40 {
				pause := func() { time.Sleep(time.Duration(rng.IntN(int(2 * idle)))) } // think time around the timeout
				var err error
				if w == 2 {
					var c tenantdb.Conn
					if c, err = p.Acquire(as("a")); err == nil {
						if _, err = c.Exec(as("a"), "begin"); err == nil {
							for range 3 {
								pause()
								if _, err = c.Exec(as("a"), "select 1"); err != nil {
									break
								}
							}
						}
						if err == nil {
							_, err = c.Exec(as("a"), "commit")
						}
						c.Release()
					}
				} else {
					var tx pgx.Tx
					if tx, err = p.Begin(as("a")); err == nil {
						for range 3 {
							pause()
							var one int
							if err = tx.QueryRow(as("a"), "select 1").Scan(&one); err != nil {
								break
							}
						}
						if err == nil {
							err = tx.Commit(as("a"))
						} else {
							_ = tx.Rollback(as("a"))
						}
					}
				}
				switch {
				case err == nil:
					worked[w]++
				case errors.Is(err, tenantdb.ErrIdleInTransaction):
					endedCalls[w]++
				default:
					errs <- fmt.Errorf("holder %d: %w", w, err)
					return
				}
			}
		}()
	}
	stop := make(chan struct{})
	otherDone := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				otherDone <- nil
				return
			default:
			}
			var s string
			if err := p.QueryRow(as("other"), "select current_setting('transaction_isolation')").Scan(&s); err != nil {
				otherDone <- fmt.Errorf("tenant other: %w", err)
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	if err := <-otherDone; err != nil {
		t.Error(err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("holders worked %v, ended %v times", worked, endedCalls)
	if s := p.TenantStat("a"); s.IdleTimeouts == 0 || s.IdleTimeouts != uint64(endedCalls[0]+endedCalls[1]+endedCalls[2]) {
		t.Errorf("TenantStat: %d idle timeouts, holders saw %v ends: want them equal and above 0", s.IdleTimeouts, endedCalls)
	}
	assertNothingHeld(t, p)
}

// TestBatchTransactionEnded: a transaction begun inside a batch
// (pgx.Batch.BeginTx through Pool.SendBatch) is under the same limits as
// one from Begin: left idle after its results are closed, or held past
// MaxHold, it is rolled back and its slot returned, its later uses fail
// with the limit's error, and its insert is gone. Reading the batch's
// results counts as a call: the transaction is not ended under them.
func TestBatchTransactionEnded(t *testing.T) {
	for _, c := range []struct {
		name          string
		idle, maxHold time.Duration
		want          error
	}{
		{"IdleInTransactionTimeout", 300 * time.Millisecond, 0, tenantdb.ErrIdleInTransaction},
		{"MaxHold", 0, 300 * time.Millisecond, tenantdb.ErrMaxHold},
	} {
		t.Run(c.name, func(t *testing.T) {
			holdTable(t, "hold_batch")
			p := holdLimitsPool(t, c.idle, c.maxHold)
			b := &pgx.Batch{}
			b.BeginTx(pgx.TxOptions{})
			b.Queue("insert into hold_batch values (1)")
			b.Queue("select pg_backend_pid()")
			br := p.SendBatch(as("a"), b)
			defer br.Close() // on a failure; a second Close does nothing
			tx := br.Tx()
			if tx == nil {
				t.Fatal("the batch began no transaction")
			}
			defer func() { _ = tx.Rollback(as("a")) }() // on a failure; after the end it does nothing
			// The results of the begin and the insert.
			for range 2 {
				if _, err := br.Exec(); err != nil {
					t.Fatal(err)
				}
			}
			var pid uint32
			if err := br.QueryRow().Scan(&pid); err != nil {
				t.Fatal(err)
			}
			if err := br.Close(); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the batch transaction's slot is back", func() bool { return p.TenantStat("a").InUse == 0 })
			if _, err := tx.Exec(as("a"), "select 1"); !errors.Is(err, c.want) || !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("Exec after the end: %v, want %v and pgx.ErrTxClosed", err, c.want)
			}
			if err := tx.Commit(as("a")); !errors.Is(err, c.want) {
				t.Errorf("Commit after the end: %v, want %v", err, c.want)
			}
			var rows int
			if err := p.QueryRow(as("other"), "select count(*) from hold_batch").Scan(&rows); err != nil || rows != 0 {
				t.Errorf("rows left by the ended transaction: %d (%v), want 0: it was not rolled back", rows, err)
			}
			if !sessionAlive(t, pid) {
				t.Errorf("backend %d gone: the end cost a server session", pid)
			}
			s := p.TenantStat("a")
			if got := s.IdleTimeouts + s.HoldTimeouts; got != 1 {
				t.Errorf("TenantStat: %d idle and %d hold timeouts, want one", s.IdleTimeouts, s.HoldTimeouts)
			}
			assertNothingHeld(t, p)
		})
	}
}
