package tenantdbtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// TestStartReplica starts a primary and its replica: a table made on the
// primary reaches the replica, which is in recovery and refuses writes.
func TestStartReplica(t *testing.T) {
	primary := tenantdbtest.StartPostgres(t)
	replica := tenantdbtest.StartReplica(t, primary)
	ctx := t.Context()
	pc, err := pgx.Connect(ctx, primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	if _, err := pc.Exec(ctx, "create table replicated (v int); insert into replicated values (42)"); err != nil {
		t.Fatal(err)
	}
	var lsn string
	if err := pc.QueryRow(ctx, "select pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	rc, err := pgx.Connect(ctx, replica.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close(ctx)
	var recovering bool
	if err := rc.QueryRow(ctx, "select pg_is_in_recovery()").Scan(&recovering); err != nil || !recovering {
		t.Fatalf("replica in recovery: %v, %v", recovering, err)
	}
	tenantdbtest.Eventually(t, time.Minute, "the replica replays the primary's table", func() bool {
		var caught bool
		return rc.QueryRow(ctx, "select pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&caught) == nil && caught
	})
	var v int
	if err := rc.QueryRow(ctx, "select v from replicated").Scan(&v); err != nil || v != 42 {
		t.Fatalf("read on the replica: %d, %v", v, err)
	}
	if _, err := rc.Exec(ctx, "insert into replicated values (1)"); err == nil {
		t.Fatal("a write on the replica succeeded")
	}
}

// TestRunReplica starts a replica for a program and terminates it.
func TestRunReplica(t *testing.T) {
	primary := tenantdbtest.StartPostgres(t)
	replica, err := tenantdbtest.RunReplica(t.Context(), primary)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := replica.Terminate(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	c, err := pgx.Connect(t.Context(), replica.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var recovering bool
	if err := c.QueryRow(t.Context(), "select pg_is_in_recovery()").Scan(&recovering); err != nil || !recovering {
		t.Fatalf("replica in recovery: %v, %v", recovering, err)
	}
}
