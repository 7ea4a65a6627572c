package pool

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestClassGetsAShareOfItsTenantsCap runs one load twice, with and without
// the keep of named classes inside a tenant: eight readers of the default
// class keep a tenant at its cap of 4 with a queue behind it, while two
// import loops of class batch (MaxConns 2) ask for slots. Without the keep,
// every freed slot goes to a queued reader and the imports starve; with it,
// the batch class is served up to its MinShare of the cap (1 slot) while it
// has work. Each run lasts until the readers made the same number of
// acquisitions, and the test compares the imports' counts.
func TestClassGetsAShareOfItsTenantsCap(t *testing.T) {
	run := func(keep bool) (imports, reads int64) {
		classKeepInTenant = keep
		defer func() { classKeepInTenant = true }()
		g, err := New(Config{Capacity: 20,
			Plans:   map[string]Plan{"p": {MaxConns: 4, MaxWaiting: Unbounded}},
			Classes: map[string]Class{"batch": {MaxConns: 2, MaxWaiting: Unbounded, MaxShare: 0.5}}})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		const readsWanted = 4000
		var readCount, importCount atomic.Int64
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		loop := func(ctx context.Context, n *atomic.Int64) {
			defer wg.Done()
			for ctx.Err() == nil {
				p, err := g.Acquire(ctx, "acme")
				if err != nil {
					return
				}
				time.Sleep(50 * time.Microsecond) // the statement
				p.Release()
				if n.Add(1) == readsWanted && n == &readCount {
					stop()
				}
			}
		}
		for range 8 {
			wg.Add(1)
			go loop(ctx, &readCount)
		}
		for range 2 {
			wg.Add(1)
			go loop(WithClass(ctx, "batch"), &importCount)
		}
		wg.Wait()
		stop()
		return importCount.Load(), readCount.Load()
	}
	without, readsWithout := run(false)
	with, readsWith := run(true)
	t.Logf("imports while the readers made %d and %d acquisitions: %d without the keep, %d with it",
		readsWithout, readsWith, without, with)
	// With the keep, one of the tenant's 4 slots serves imports while they
	// wait: about a quarter of the acquisitions, a third of the reads.
	if with < readsWith/10 || with < 10*(without+1) {
		t.Errorf("imports: %d with the keep, %d without it (reads %d, %d): want a share of the cap, and over ten times more",
			with, without, readsWith, readsWithout)
	}
}
