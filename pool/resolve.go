package pool

import (
	"context"
	"fmt"
	"strings"
)

// resolveLocked finds or creates the state of tenant id, asking Lookup and
// Placement (outside the lock) when they are configured. Called with g.mu held; returns with it held
// on success and released on error. stale is the existing state whose Lookup
// answer expired, or nil.
func (g *Gate) resolveLocked(ctx context.Context, id string, stale *tenant) (*tenant, error) {
	if stale == nil {
		if err := validateID(id, g.cfg.MaxTenantIDLen); err != nil {
			g.mu.Unlock()
			return nil, err
		}
	}
	var answer Tenant
	var place Placement
	if g.resolves() {
		if err := g.failed.getLocked(id, g.nowLocked(), int64(g.cfg.LookupErrorTTL)); err != nil {
			g.mu.Unlock()
			return nil, err
		}
		if stale != nil {
			stale.refreshing = true // others keep using the stale answer meanwhile
		}
		g.mu.Unlock()
		var err, placeErr error
		if g.cfg.Lookup != nil {
			answer, err = g.lookup(ctx, id, stale)
		}
		if err == nil && g.cfg.Placement != nil {
			place, placeErr = g.place(ctx, id)
		}
		g.mu.Lock()
		if stale != nil {
			stale.refreshing = false
		}
		if err != nil {
			return nil, g.lookupFailedLocked(ctx, id, fmt.Errorf("pool: lookup tenant %q: %w", id, lookupError{err}))
		}
		if placeErr != nil {
			return nil, g.lookupFailedLocked(ctx, id, placeErr)
		}
		if g.closed {
			g.mu.Unlock()
			return nil, ErrClosed
		}
	}
	plan := g.defaultPlan
	if answer.Plan != "" {
		if plan = g.plans[answer.Plan]; plan == nil {
			return nil, g.lookupFailedLocked(ctx, id, fmt.Errorf("%w %q for tenant %q", ErrUnknownPlan, answer.Plan, id))
		}
	}
	if capacity := g.cfg.tenantCapacity(); answer.MaxConns < 0 || answer.MaxConns > capacity {
		return nil, g.lookupFailedLocked(ctx, id, fmt.Errorf("%w: Lookup gave tenant %q MaxConns %d, outside 0 to capacity %d",
			ErrInvalidConfig, id, answer.MaxConns, capacity))
	}
	if answer.StatementTimeout < 0 || answer.IdleInTransactionTimeout < 0 || answer.MaxHold < 0 {
		return nil, g.lookupFailedLocked(ctx, id, fmt.Errorf("%w: Lookup gave tenant %q a negative time limit: "+
			"StatementTimeout %v, IdleInTransactionTimeout %v, MaxHold %v",
			ErrInvalidConfig, id, answer.StatementTimeout, answer.IdleInTransactionTimeout, answer.MaxHold))
	}
	at, err := g.placedLocked(id, place)
	if err != nil {
		return nil, g.lookupFailedLocked(ctx, id, err)
	}
	now := g.nowLocked()
	t := g.tenants[id] // it may have been created while the lock was released
	if t == nil {
		if len(g.tenants) >= g.cfg.MaxTenants && !g.makeRoomLocked(now) {
			n := len(g.tenants)
			g.mu.Unlock()
			return nil, fmt.Errorf("%w: %d tracked and all busy", ErrTooManyTenants, n)
		}
		t = &tenant{id: strings.Clone(id)} // do not pin the caller's buffer
		t.idleLink.v = t
		g.tenants[t.id] = t
		if len(g.tenants) > g.tenantsPeak {
			g.tenantsPeak = len(g.tenants)
		}
	}
	t.plan, t.lookupMax, t.resolvedAt = plan, answer.MaxConns, now
	t.lookupLimits = nil
	if answer.StatementTimeout > 0 || answer.IdleInTransactionTimeout > 0 || answer.MaxHold > 0 {
		t.lookupLimits = &timeLimits{stmt: answer.StatementTimeout, idle: answer.IdleInTransactionTimeout, hold: answer.MaxHold}
	}
	g.placeLocked(t, at)
	g.applyLimitLocked(t)
	return t, nil
}

// lookupFailedLocked caches err as id's Lookup failure for LookupErrorTTL,
// unless the request's own context ended (its Lookup may have failed for
// that alone), unlocks and returns err.
func (g *Gate) lookupFailedLocked(ctx context.Context, id string, err error) error {
	if ctx.Err() == nil {
		g.failed.addLocked(id, err, g.nowLocked(), int64(g.cfg.LookupErrorTTL), g.cfg.MaxTenants)
	}
	g.mu.Unlock()
	return err
}

// resolves reports whether a tenant's state comes from Lookup or
// Placement, which are asked again when their answer is LookupTTL old.
func (g *Gate) resolves() bool { return g.cfg.Lookup != nil || g.cfg.Placement != nil }

// lookup calls Config.Lookup, unlocked. Should Lookup panic, stale's refresh
// is marked over before the panic goes on to the caller, so that the next
// request asks again.
func (g *Gate) lookup(ctx context.Context, id string, stale *tenant) (Tenant, error) {
	returned := false
	defer func() {
		if !returned && stale != nil {
			g.mu.Lock()
			stale.refreshing = false
			g.mu.Unlock()
		}
	}()
	answer, err := g.cfg.Lookup(ctx, id)
	returned = true
	return answer, err
}

// lookupError is what Lookup failed with, matching ErrLookup too.
type lookupError struct{ err error }

func (e lookupError) Error() string   { return e.err.Error() }
func (e lookupError) Unwrap() []error { return []error{ErrLookup, e.err} }
