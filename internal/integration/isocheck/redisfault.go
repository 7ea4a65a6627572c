package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool/redislimit"
)

// Redis cut off (the cluster configurations): the limiter reaches Redis
// through a proxy of the checker's own (e.redisProxy), which now and then
// forwards nothing for 0.2 to 5 s (every 4 to 10 s), half the time closing every connection
// too: Redis paused, then Redis unreachable. The lease TTL is 5 s, so the
// longer cut-offs outlive the leases held. What must hold is what the
// limiter's Mode documents: FailOpen, each tenant within its cap in this
// process (the sampler checks TenantStat and the server's count);
// FailClosed, no call runs without a lease, and calls fail with errors
// matching redislimit.ErrUnavailable or tenantdb.ErrRevoked, nothing else.
// Nothing is lost: after the Pool is closed, Redis holds no live lease of
// the run once LeaseTTL has passed.

const leaseTTL = 5 * time.Second

// redisOpTimeout is the limiter's OpTimeout (its default): a Redis that
// does not answer within it is unavailable to the limiter.
const redisOpTimeout = 500 * time.Millisecond

// redisLoop cuts Redis off now and then until ctx ends.
func (rc *runCtx) redisLoop(ctx context.Context, wg *sync.WaitGroup, r *rand.Rand) {
	defer wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(4000+r.IntN(6000)) * time.Millisecond):
		}
		d := time.Duration(200+r.IntN(4800)) * time.Millisecond
		rc.mu.Lock()
		w := &dropWindow{from: time.Now(), to: time.Now().Add(time.Hour)}
		rc.redisCuts = append(rc.redisCuts, w)
		rc.mu.Unlock()
		rc.env.redisProxy.cutOff(d, r.IntN(2) == 0)
		rc.faults.Add(1)
		rc.redisOut.Add(1)
		rc.mu.Lock()
		// A degraded limiter answers so until a probe finds Redis again
		// (RecheckEvery, 1 s) and reconciles its leases.
		w.to = time.Now().Add(3 * time.Second)
		rc.mu.Unlock()
	}
}

// redisCutSince reports whether Redis was cut off (or the limiter may still
// be degraded by it) at some time since started.
func (rc *runCtx) redisCutSince(started time.Time) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, w := range rc.redisCuts {
		if w.to.After(started) {
			return true
		}
	}
	return false
}

// redisSlow reports whether Redis, reached through the limiter's proxy,
// does not answer a PING within the limiter's OpTimeout now: on a starved
// machine it can stay so well after a cut-off ended, and a FailClosed
// limiter then rightly goes on refusing. A Redis that answers in time
// makes a refusal outside the cut-offs a violation still.
func (rc *runCtx) redisSlow() bool {
	client := redis.NewClient(&redis.Options{Addr: rc.env.redisProxy.addr(), MaxRetries: -1})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), redisOpTimeout)
	defer cancel()
	return client.Ping(ctx).Err() != nil
}

// redisRefused reports whether err is the limiter's documented refusal
// while Redis cannot be asked in FailClosed mode.
func redisRefused(err error) bool { return errors.Is(err, redislimit.ErrUnavailable) }

// auditLeases checks, after the Pool and its limiter closed, that Redis
// holds no live lease of the run's prefix once LeaseTTL has passed: a lease
// the limiter could not give back during a cut-off expires, none is renewed
// after Close. It asks Redis directly, not through the proxy.
func (rc *runCtx) auditLeases(prefix string) {
	client := redis.NewClient(&redis.Options{Addr: rc.env.redisAddr})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), leaseTTL+10*time.Second)
	defer cancel()
	deadline := time.Now().Add(leaseTTL + 2*time.Second)
	var last string
	for {
		last = ""
		now, err := client.Time(ctx).Result()
		if err != nil {
			rc.violate(-1, "lease audit: "+err.Error())
			return
		}
		for _, t := range rc.env.tenants {
			key := "{" + prefix + ":" + t + "}:slots"
			n, err := client.ZCount(ctx, key, fmt.Sprint(now.UnixMilli()), "+inf").Result()
			if err != nil {
				rc.violate(-1, "lease audit: "+err.Error())
				return
			}
			if n > 0 {
				last += fmt.Sprintf(" %s: %d", t, n)
			}
		}
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			rc.violate(-1, fmt.Sprintf("at the end: Redis still holds live leases of the closed limiter, %v after it closed (LeaseTTL %v):%s", leaseTTL+2*time.Second, leaseTTL, last))
			return
		}
		time.Sleep(200 * time.Millisecond) // polling Redis, not synchronising
	}
}
