package tenantdb_test

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// activitySampler counts, every 2 ms from a connection of its own, the
// active backends whose query contains a marker, and keeps the most it saw:
// what PostgreSQL itself says a tenant holds, whatever the pools think.
type activitySampler struct {
	stopc              chan struct{}
	stopOnce           sync.Once
	done               chan struct{}
	max, now, nsamples atomic.Int64
}

func startActivitySampler(t *testing.T, marker string) *activitySampler {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	s := &activitySampler{stopc: make(chan struct{}), done: make(chan struct{})}
	// A test that fails before it stops the sampler must not leave it
	// logging into a finished test (a panic that ends the whole package).
	t.Cleanup(func() { s.stop() })
	go func() {
		defer close(s.done)
		defer conn.Close(context.Background())
		for {
			var n int64
			err := conn.QueryRow(context.Background(),
				`select count(*) from pg_stat_activity
				 where state = 'active' and pid <> pg_backend_pid() and strpos(query, $1) > 0`, marker).Scan(&n)
			if err != nil {
				t.Errorf("sampler: %v", err)
				return
			}
			s.nsamples.Add(1)
			s.now.Store(n)
			if n > s.max.Load() {
				s.max.Store(n)
			}
			select {
			case <-s.stopc:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return s
}

// current is the latest count.
func (s *activitySampler) current() int { return int(s.now.Load()) }

// peak is the most active backends seen at once so far.
func (s *activitySampler) peak() int { return int(s.max.Load()) }

// samples is how many counts were taken.
func (s *activitySampler) samples() int64 { return s.nsamples.Load() }

// stop ends the sampling and returns the most active backends seen at once.
func (s *activitySampler) stop() int {
	s.stopOnce.Do(func() { close(s.stopc) })
	<-s.done
	return int(s.max.Load())
}

// terminateBackends ends, from outside any pool, the backends that are not
// idle and whose query contains marker, and returns how many it ended.
func terminateBackends(t *testing.T, marker string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), sharedPG.DSN)
	if err != nil {
		t.Error(err)
		return 0
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(context.Background(),
		`select count(pg_terminate_backend(pid)) from pg_stat_activity
		 where state <> 'idle' and pid <> pg_backend_pid() and strpos(query, $1) > 0`, marker).Scan(&n)
	if err != nil {
		t.Error(err)
	}
	return n
}

func median[T cmp.Ordered](xs []T) T {
	var zero T
	if len(xs) == 0 {
		return zero
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
