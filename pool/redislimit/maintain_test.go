package redislimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// holdFlushes is a client hook that tells of every renewal and flush (a
// pipeline of renewScript or releaseScript calls) as it starts, and holds
// each flush until the test lets it go.
type holdFlushes struct {
	started chan string   // "renew" or "flush"
	proceed chan struct{} // lets one held flush go
	stop    chan struct{} // closed: lets every flush go
}

func (holdFlushes) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (holdFlushes) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h holdFlushes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		kind := ""
		for _, c := range cmds {
			if args := c.Args(); len(args) > 1 && c.Name() == "evalsha" {
				switch args[1] {
				case renewScript.Hash():
					kind = "renew"
				case releaseScript.Hash():
					kind = "flush"
				}
			}
		}
		if kind == "" {
			return next(ctx, cmds)
		}
		select {
		case h.started <- kind:
		case <-h.stop:
		}
		if kind == "flush" {
			select {
			case <-h.proceed:
			case <-h.stop:
			case <-ctx.Done():
			}
		}
		return next(ctx, cmds)
	}
}

// next returns the kind of the next renewal or flush to start.
func (h holdFlushes) next(t *testing.T) string {
	t.Helper()
	select {
	case k := <-h.started:
		return k
	case <-time.After(time.Minute):
		t.Fatal("no renewal or flush started within a minute")
		return ""
	}
}

// TestRedisDueRenewalGoesBeforeFlushes releases leases steadily, each
// flush held until a renewal has fallen due, and the next release kicked:
// when the held flush ends, both the renewal and a flush are ready. The
// renewal must go first, so that a due renewal waits for one call at most
// (the one running), up to OpTimeout, whatever the stream of releases.
// Go's select picks at random among ready cases: a flush went first in
// about half of the rounds, and each such flush may take up to OpTimeout.
func TestRedisDueRenewalGoesBeforeFlushes(t *testing.T) {
	const (
		renewEvery = 20 * time.Millisecond
		rounds     = 12
	)
	ctx := context.Background()
	rdb := newClient(t, sharedRedis(t))
	// Loaded, so that no pipeline meets NOSCRIPT and is sent twice.
	for _, s := range []*redis.Script{renewScript, releaseScript} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			t.Fatalf("SCRIPT LOAD: %v", err)
		}
	}
	h := holdFlushes{started: make(chan string, 1000), proceed: make(chan struct{}), stop: make(chan struct{})}
	rdb.AddHook(h)
	// OpTimeout far longer than the test: no held flush counts as a failure.
	l := newLimiter(t, Config{Client: rdb, LeaseTTL: time.Hour, RenewEvery: renewEvery, OpTimeout: time.Minute})
	t.Cleanup(func() { close(h.stop) }) // before Close, whose release would be held
	mustAcquire(t, l, "kept", 1)        // so that every renewal has a lease to renew
	var x []interface{ Release() }
	for range rounds + 1 {
		x = append(x, mustAcquire(t, l, "gone", rounds+1))
	}

	x[0].Release()
	held, starved := false, 0
	for i := 1; i <= rounds; i++ {
		for !held {
			held = h.next(t) == "flush"
		}
		// Ticks come every RenewEvery and maintain takes none while the
		// flush runs: once RenewEvery has passed, a renewal is due.
		time.Sleep(renewEvery)
		x[i].Release() // kicks a flush
		h.proceed <- struct{}{}
		if h.next(t) == "flush" {
			starved++ // and it is held: the next round's
		} else {
			held = false
		}
	}
	if starved > 0 {
		t.Errorf("in %d of %d rounds a flush started before the renewal due when the previous flush ended", starved, rounds)
	}
}
