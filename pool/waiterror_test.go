package pool_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

// blockingCluster is a ClusterLimiter with no free slot: it answers only
// when ctx ends, with ctx's error.
type blockingCluster struct{}

func (blockingCluster) AcquireSlot(ctx context.Context, _ string, _ int, _ time.Duration) (pool.ClusterLease, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestWaitErrorNamesStage(t *testing.T) {
	plans := map[string]pool.Plan{"std": {MaxConns: 1, MaxWaiting: 5}}
	for _, tc := range []struct {
		stage  pool.Stage
		cfg    pool.Config
		holder string // who holds a slot while acme waits; empty for none
	}{
		{pool.StageTenant, pool.Config{Capacity: 2, Plans: plans}, "acme"},
		{pool.StageShared, pool.Config{Capacity: 1, Plans: plans}, "other"},
		{pool.StageCluster, pool.Config{Capacity: 2, Plans: plans, Cluster: blockingCluster{}}, ""},
	} {
		for _, want := range []error{context.DeadlineExceeded, context.Canceled} {
			t.Run(string(tc.stage)+"/"+want.Error(), func(t *testing.T) {
				g := mustNew(t, tc.cfg)
				if tc.holder != "" {
					defer mustAcquire(t, g, tc.holder).Release()
				}
				ctx, cancel := context.WithCancel(context.Background())
				if want == context.DeadlineExceeded {
					ctx, cancel = context.WithTimeout(context.Background(), 10*time.Millisecond)
				}
				defer cancel()
				ch := acquireAsync(ctx, g, "acme")
				eventually(t, "acme waits", waitingIs(g, 1))
				if want == context.Canceled {
					cancel()
				}
				err := recv(t, ch).err
				var we *pool.WaitError
				if !errors.As(err, &we) {
					t.Fatalf("err = %v (%T), want a *pool.WaitError", err, err)
				}
				if we.Stage != tc.stage || we.Tenant != "acme" || we.Waited <= 0 {
					t.Fatalf("WaitError = %+v, want stage %q, tenant acme, a positive wait", we, tc.stage)
				}
				if !errors.Is(err, want) || errors.Is(err, pool.ErrOverLimit) {
					t.Fatalf("err = %v: want it to match %v and not ErrOverLimit", err, want)
				}
				if !strings.Contains(err.Error(), string(tc.stage)) {
					t.Fatalf("message %q does not name the stage %q", err, tc.stage)
				}
				if s := g.Stat(); s.Waiting != 0 {
					t.Fatalf("Waiting = %d after the wait ended", s.Waiting)
				}
			})
		}
	}
}
