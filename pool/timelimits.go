package pool

import (
	"context"
	"time"
)

// Time limits. A plan bounds how long its tenants' work may take, besides
// how much of it runs at once: each statement (StatementTimeout), a
// transaction its holder leaves idle (IdleInTransactionTimeout) and the
// whole hold of a connection (MaxHold). The Gate only carries them: each
// permit gets its tenant's values when it is granted (Lookup's override,
// else the plan's, lowered by its class's), and its holder (tenantdb)
// enforces them and reports what it ended with Permit.Exceeded, which
// TenantStat counts.

// timeLimits are the time limits of one permit's work; 0 means none.
type timeLimits struct {
	stmt, idle, hold time.Duration
}

// ownTimeLimits returns the limits of t's work of the default class: its
// plan's, each overridden by Lookup's where it gave one. Gate.applyLimitLocked
// keeps t.limits to it, so that a grant only copies it.
func (t *tenant) ownTimeLimits() timeLimits {
	l := timeLimits{stmt: t.plan.StatementTimeout, idle: t.plan.IdleInTransactionTimeout, hold: t.plan.MaxHold}
	if o := t.lookupLimits; o != nil {
		l = timeLimits{stmt: lowest(l.stmt, o.stmt), idle: lowest(l.idle, o.idle), hold: lowest(l.hold, o.hold)}
	}
	return l
}

// timeLimits returns the limits of t's work of class c: t's own, each
// lowered by the class's.
func (t *tenant) timeLimits(c *classState) timeLimits {
	if c.index == 0 {
		return t.limits
	}
	l := t.limits
	l.stmt = lower(l.stmt, c.StatementTimeout)
	l.idle = lower(l.idle, c.IdleInTransactionTimeout)
	l.hold = lower(l.hold, c.MaxHold)
	return l
}

// lowest is override when it is set, else plan's.
func lowest(plan, override time.Duration) time.Duration {
	if override > 0 {
		return override
	}
	return plan
}

// lower is the smaller of two limits, where 0 is none.
func lower(a, b time.Duration) time.Duration {
	if b > 0 && (a == 0 || b < a) {
		return b
	}
	return a
}

// StatementTimeout returns the statement timeout of the permit's work: its
// tenant's (Tenant.StatementTimeout, else Plan.StatementTimeout) at the
// grant, lowered by its class's; 0 for none. Only the permit's holder may
// call it, before Release.
func (p Permit) StatementTimeout() time.Duration {
	if p.s == nil {
		return 0
	}
	return p.s.limits.stmt
}

// IdleInTransactionTimeout returns how long the permit's work may leave a
// transaction idle (Tenant's, else Plan.IdleInTransactionTimeout, lowered
// by its class's); 0 for no limit. As StatementTimeout, for its holder.
func (p Permit) IdleInTransactionTimeout() time.Duration {
	if p.s == nil {
		return 0
	}
	return p.s.limits.idle
}

// MaxHold returns how long the permit may be held (Tenant's, else
// Plan.MaxHold, lowered by its class's); 0 for no limit. As
// StatementTimeout, for its holder.
func (p Permit) MaxHold() time.Duration {
	if p.s == nil {
		return 0
	}
	return p.s.limits.hold
}

// TimeLimit names one of a tenant's time limits, which its work exceeded
// (Permit.Exceeded).
type TimeLimit uint8

const (
	// LimitStatement: a statement ran past its StatementTimeout.
	LimitStatement TimeLimit = iota
	// LimitIdleInTransaction: a transaction was idle for its
	// IdleInTransactionTimeout and was ended.
	LimitIdleInTransaction
	// LimitMaxHold: a connection was held for its MaxHold and was ended.
	LimitMaxHold

	numTimeLimits = iota
)

func (l TimeLimit) String() string {
	switch l {
	case LimitStatement:
		return "statement_timeout"
	case LimitIdleInTransaction:
		return "idle_in_transaction"
	case LimitMaxHold:
		return "max_hold"
	}
	return "unknown"
}

// TimeLimitTracer is optionally implemented by a Config.Tracer to observe
// work that exceeded a time limit (Permit.Exceeded). TraceTimeLimit is
// called outside any lock, from the goroutine that reports it, with the
// context TraceAcquireStart returned for the permit.
type TimeLimitTracer interface {
	TraceTimeLimit(ctx context.Context, g *Gate, data TraceTimeLimitData)
}

// TraceTimeLimitData describes work that exceeded a time limit.
type TraceTimeLimitData struct {
	Tenant, Plan string
	// Class is the permit's class, empty for the default class.
	Class string
	// Limit is the limit exceeded, and Value its value for the permit.
	Limit TimeLimit
	Value time.Duration
}

// Exceeded records that the permit's work exceeded limit l and was ended
// by its holder: TenantStat counts it, and a TimeLimitTracer sees it.
// After Release it does nothing.
func (p Permit) Exceeded(l TimeLimit) {
	s := p.s
	if s == nil || l >= numTimeLimits {
		return
	}
	g := s.g
	g.mu.Lock()
	if s.gen != p.gen {
		g.mu.Unlock()
		return
	}
	t := s.t
	if t.exceeded == nil {
		t.exceeded = new([numTimeLimits]uint64)
	}
	t.exceeded[l]++
	tr, _ := g.cfg.Tracer.(TimeLimitTracer)
	var d TraceTimeLimitData
	if tr != nil {
		d = TraceTimeLimitData{Tenant: t.id, Plan: t.plan.name, Limit: l}
		if s.class.index != 0 {
			d.Class = s.class.name
		}
		switch l {
		case LimitStatement:
			d.Value = s.limits.stmt
		case LimitIdleInTransaction:
			d.Value = s.limits.idle
		case LimitMaxHold:
			d.Value = s.limits.hold
		}
	}
	ctx := s.ctx
	g.mu.Unlock()
	if tr != nil {
		if ctx == nil {
			ctx = context.Background()
		}
		tr.TraceTimeLimit(ctx, g, d)
	}
}
