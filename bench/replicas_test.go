package bench

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// BenchmarkReplicas runs a primary and its streaming replica and measures,
// in one run:
//
//   - route: p50 of 2,000 serial "select 1" calls of a tenant, marked
//     ReadOnly (on the replica) and not (on the primary), interleaved: the
//     routing adds no round trip;
//   - lag: with MaxLag 500 ms and ProbeEvery 50 ms, replay paused on the
//     replica and a row written on the primary: how long until the replica
//     takes no reads (MaxLag, to within ProbeEvery), and after the replay
//     resumes, until it takes them again;
//   - stopped: the replica stopped and seen down: the p50 and max of 1,000
//     reads failing with ErrReplicaUnavailable (FailRead), and the p50 of
//     reads falling back to the primary (ReadPrimary).
func BenchmarkReplicas(b *testing.B) {
	ctx := context.Background()
	primary := tenantdbtest.StartPostgres(b, tenantdbtest.WithSetting("cluster_name", "primary"))
	replica := tenantdbtest.StartReplica(b, primary, tenantdbtest.WithSetting("cluster_name", "replica"))
	onReplica, err := pgx.Connect(ctx, replica.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer onReplica.Close(ctx)
	onPrimary, err := pgx.Connect(ctx, primary.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer onPrimary.Close(ctx)
	if _, err := onPrimary.Exec(ctx, "create table if not exists lagged (at timestamptz)"); err != nil {
		b.Fatal(err)
	}
	newPool := func(fallback tenantdb.ReplicaFallback) *tenantdb.Pool {
		pc, err := pgxpool.ParseConfig(primary.DSN)
		if err != nil {
			b.Fatal(err)
		}
		rc, err := pgxpool.ParseConfig(replica.DSN)
		if err != nil {
			b.Fatal(err)
		}
		pc.MaxConns, rc.MaxConns = 10, 10
		p, err := tenantdb.NewServers(ctx, map[string]*pgxpool.Config{"s0": pc}, tenantdb.Config{
			Plans:  map[string]tenantdb.Plan{"p": {MaxConns: 4}},
			Logger: slog.New(slog.DiscardHandler),
			Placement: func(context.Context, string) (tenantdb.Placement, error) {
				return tenantdb.Placement{Server: "s0"}, nil
			},
		}, tenantdb.WithReplicas("s0", tenantdb.Replicas{Configs: []*pgxpool.Config{rc},
			MaxLag: 500 * time.Millisecond, ProbeEvery: 50 * time.Millisecond, Unavailable: fallback}))
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	usable := func(p *tenantdb.Pool) bool { return p.ServersStat()[0].Replicas[0].Usable }
	waitFor := func(what string, cond func() bool) time.Duration {
		start := time.Now()
		for !cond() {
			if time.Since(start) > time.Minute {
				b.Fatalf("waited a minute for %s", what)
			}
			time.Sleep(time.Millisecond) // the resolution of the measure
		}
		return time.Since(start)
	}
	tenant := tenantdb.WithTenant(ctx, "acme")
	read := tenantdb.ReadOnly(tenant)
	for b.Loop() {
		fallback, failing := newPool(tenantdb.ReadPrimary), newPool(tenantdb.FailRead)
		waitFor("the first probe", func() bool { return usable(fallback) && usable(failing) })

		// route
		var onR, onP []time.Duration
		for i := range 4000 {
			c, list := tenant, &onP
			if i%2 == 0 {
				c, list = read, &onR
			}
			start := time.Now()
			if _, err := fallback.Exec(c, "select 1"); err != nil {
				b.Fatal(err)
			}
			*list = append(*list, time.Since(start))
		}
		b.Logf("route: p50 of 2,000 reads on the replica %v, of 2,000 calls on the primary %v; replica reads %d",
			median(onR), median(onP), fallback.ServersStat()[0].Replicas[0].Reads)
		b.ReportMetric(float64(median(onR).Microseconds()), "replica-p50-µs")
		b.ReportMetric(float64(median(onP).Microseconds()), "primary-p50-µs")

		// lag
		if _, err := onReplica.Exec(ctx, "select pg_wal_replay_pause()"); err != nil {
			b.Fatal(err)
		}
		if _, err := onPrimary.Exec(ctx, "insert into lagged values (now())"); err != nil {
			b.Fatal(err)
		}
		behind := waitFor("the replica behind MaxLag", func() bool { return !usable(fallback) })
		if _, err := onReplica.Exec(ctx, "select pg_wal_replay_resume()"); err != nil {
			b.Fatal(err)
		}
		back := waitFor("the replica caught up", func() bool { return usable(fallback) })
		b.Logf("lag: paused replay and a write: the replica took no reads after %v (MaxLag 500ms, ProbeEvery 50ms); "+
			"resumed, reads again after %v", behind.Round(time.Millisecond), back.Round(time.Millisecond))
		b.ReportMetric(float64(behind.Milliseconds()), "behind-ms")

		// stopped
		if err := replica.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		waitFor("the replica seen stopped", func() bool { return !usable(fallback) && !usable(failing) })
		var failed, fellBack []time.Duration
		for range 1000 {
			start := time.Now()
			_, err := failing.Exec(read, "select 1")
			failed = append(failed, time.Since(start))
			if !errors.Is(err, tenantdb.ErrReplicaUnavailable) {
				b.Fatalf("a read with the replica stopped, FailRead: %v", err)
			}
			start = time.Now()
			if _, err := fallback.Exec(read, "select 1"); err != nil {
				b.Fatalf("a read with the replica stopped, ReadPrimary: %v", err)
			}
			fellBack = append(fellBack, time.Since(start))
		}
		b.Logf("stopped: 1,000 reads failed with ErrReplicaUnavailable in p50 %v, max %v; 1,000 fell back to the primary in p50 %v",
			median(failed), slices.Max(failed), median(fellBack))
		b.ReportMetric(float64(median(failed).Nanoseconds()), "failed-p50-ns")
		if err := replica.Start(ctx); err != nil {
			b.Fatal(err)
		}
		fallback.Close()
		failing.Close()
	}
}
