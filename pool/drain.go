package pool

import (
	"context"
	"errors"
	"fmt"
)

// Draining a tenant, to move it. While a Drain is in force the tenant's cap
// is 0: its new requests wait in its queue for a slot, by its plan's (or
// class's) MaxWaiting and MaxWait and their contexts, or are rejected when
// it is full; requests that held a slot and waited for capacity go back to
// the front of that queue; its reservation is given back. Its permits in
// use are never revoked: Done is closed when the last is released. Resume
// gives the tenant its limits back, on a new placement if it names one,
// and its waiting requests go on there. It is the limit cut that SetPlan
// makes, to 0: one admission path still.

// ErrMoving is returned by Drain for a tenant that is already draining.
var ErrMoving = errors.New("pool: the tenant is already draining")

// Drain is a drain of one tenant in force, from Gate.Drain until Resume.
type Drain struct {
	g    *Gate
	t    *tenant
	done chan struct{}
}

// drainState is a tenant's drain in force.
type drainState struct {
	done   chan struct{}
	closed bool // guarded by Gate.mu: done is closed
}

// Drain stops granting tenantID's requests and returns at once; Done tells
// when its permits in use are all released. ctx governs the tenant's Lookup
// and Placement if it is not tracked yet. Resume ends it; until then the
// tenant is never evicted.
func (g *Gate) Drain(ctx context.Context, tenantID string) (*Drain, error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, ErrClosed
	}
	t := g.tenants[tenantID]
	if t == nil {
		var err error
		if t, err = g.resolveLocked(ctx, tenantID, nil); err != nil {
			return nil, err // resolveLocked unlocked
		}
	}
	defer g.mu.Unlock()
	if t.move != nil {
		return nil, fmt.Errorf("%w: %q", ErrMoving, tenantID)
	}
	if t.idleList != notIdle {
		g.unidleLocked(t)
	}
	t.move = &drainState{done: make(chan struct{})}
	g.applyLimitLocked(t)
	g.drainedLocked(t)
	return &Drain{g: g, t: t, done: t.move.done}, nil
}

// Done returns a channel closed once the tenant holds no permit.
func (d *Drain) Done() <-chan struct{} { return d.done }

// Resume ends the drain: the tenant's limits are back, and its waiting
// requests are served. With a non-nil at, the tenant is placed there
// first (at.Server one of Config.Servers), which needs the drain done: it
// is an error otherwise, and the tenant resumes where it was. Only the
// first Resume has an effect.
func (d *Drain) Resume(at *Placement) error {
	g, t := d.g, d.t
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.move == nil || t.move.done != d.done {
		return nil
	}
	var err error
	if at != nil {
		var p *placed
		switch p, err = g.placedLocked(t.id, *at); {
		case err != nil:
		case t.inUse > 0:
			err = fmt.Errorf("pool: tenant %q holds %d permits: Resume with a placement needs the drain done", t.id, t.inUse)
		default:
			t.place, t.srv, t.next, t.resolvedAt = p, p.srv, nil, g.nowLocked()
		}
	}
	t.move = nil
	g.applyLimitLocked(t)
	if t.isIdle() {
		g.markIdleLocked(t, g.nowLocked())
	}
	return err
}

// drainedLocked closes t's drain's Done once t holds no permit.
func (g *Gate) drainedLocked(t *tenant) {
	if m := t.move; m != nil && !m.closed && t.inUse == 0 {
		m.closed = true
		close(m.done)
	}
}
