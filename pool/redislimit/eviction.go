package redislimit

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// ErrEvictionPolicy is matched by CheckEviction's error when a Redis node
// may evict keys (maxmemory-policy is not noeviction): under memory pressure
// it could drop a tenant's sorted set, forgetting every lease in it, and the
// tenant could then hold twice its cap until those requests end.
var ErrEvictionPolicy = errors.New("redislimit: redis may evict the limiter's keys")

// CheckEviction asks each Redis master for its maxmemory-policy and returns
// an error matching ErrEvictionPolicy if one is not "noeviction", which is
// what the limiter needs: with noeviction a full Redis refuses writes (the
// limiter then follows Mode, see ErrorOOM) instead of silently dropping
// leases. Some managed services disable CONFIG; the error then says so and
// does not match ErrEvictionPolicy. ctx governs the calls. The limiter runs
// it once in the background after its first renewal and logs a warning if
// it fails; call it yourself to fail a deployment early.
func (l *Limiter) CheckEviction(ctx context.Context) error {
	if cc, ok := l.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return checkEviction(ctx, c)
		})
	}
	return checkEviction(ctx, l.client)
}

func checkEviction(ctx context.Context, c redis.Cmdable) error {
	m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return fmt.Errorf("redislimit: cannot read maxmemory-policy: %w", err)
	}
	if p, ok := m["maxmemory-policy"]; ok && p != "noeviction" {
		return fmt.Errorf("%w: maxmemory-policy is %q, want \"noeviction\"", ErrEvictionPolicy, p)
	}
	return nil
}

// warnEviction logs CheckEviction's complaint, if any.
func (l *Limiter) warnEviction() {
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.OpTimeout)
	defer cancel()
	if err := l.CheckEviction(ctx); err != nil && l.ctx.Err() == nil {
		l.log.Warn("redislimit: "+err.Error()+"; set maxmemory-policy noeviction on the limiter's Redis", "err", err)
	}
}
