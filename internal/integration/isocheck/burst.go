package main

import (
	"context"
	"sync"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// A burst (the Config.Database configurations): one op sends pg_sleep(20)
// for its tenant and the next one at once, as many as the budget holds,
// each with a deadline of 0.5 to 2 s, so that the budget is full of
// statements whose deadlines end while they run: their cancel requests
// must go out, and the server must never count more backends than the
// budget for long (the sampler checks it; issue 51, 2).

// burstHostile is the catalog entry a burst's statements count as.
var burstHostile = func() int {
	for i, h := range catalog {
		if h.name == "sleep-cut" {
			return i
		}
	}
	panic("isocheck: no sleep-cut in the catalog")
}()

// execBurst runs o as a burst.
func (rc *runCtx) execBurst(o op) []string {
	h := &catalog[burstHostile]
	n := int(rc.pool.Stat().MaxConns())
	started := time.Now()
	var mu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	for i := range n {
		tenant := rc.env.tenants[(o.tenant+i%2)%numTenants]
		rc.hostiles.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(tenantdb.WithTenant(rc.ctx, tenant), o.cut)
			defer cancel()
			_, err := rc.pool.Exec(ctx, "select pg_sleep(20)")
			if m := rc.judgeErr(ctx, tenant, err, true, h, started); m != "" {
				mu.Lock()
				bad = append(bad, "burst: "+m)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return bad
}
