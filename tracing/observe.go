package tracing

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// ErrObserving is returned by ObservePool and ObserveGate when the Tracer
// already observes a pool: its metrics carry one pool name, and two pools
// under it would report each other's numbers. Stop the first, or use one
// Tracer per pool.
var ErrObserving = errors.New("tracing: already observing a pool")

// ObservePool registers the observable metrics of p with the Tracer's
// MeterProvider: db.client.connection.count (used and idle connections of
// the shared pgxpool), db.client.connection.max, db.client.connection.
// pending_requests (requests waiting for a tenant's cap or a shared
// connection), and the per-tenant gauges. They are read from p's stats at
// each collection, which is also when TopTenants picks the busiest tenants.
// stop unregisters them. p must use this Tracer (tenantdb.Config.Tracer)
// for the pushed metrics and the observed ones to agree, but nothing breaks
// if it does not.
func (t *Tracer) ObservePool(p *tenantdb.Pool) (stop func() error, err error) {
	if p == nil {
		return nil, errors.New("tracing: ObservePool: nil pool")
	}
	return t.observe(p.Gate(), func(o metric.Observer) {
		if st := p.DatabasesStat(); st.Budget > 0 {
			t.observeDatabases(o, p, st)
			return
		}
		s := p.Pgxpool().Stat()
		o.ObserveInt64(t.connCount, int64(s.AcquiredConns()), t.usedObs...)
		o.ObserveInt64(t.connCount, int64(s.IdleConns()), t.idleObs...)
		o.ObserveInt64(t.connMax, int64(s.MaxConns()), t.poolObs...)
	})
}

// observeDatabases reports a Pool with tenantdb.Config.Database: the
// connections of every database against the budget, each database with a
// connection open, and the opens, closes and their time.
func (t *Tracer) observeDatabases(o metric.Observer, p *tenantdb.Pool, st tenantdb.DatabasesStat) {
	var used, idle int64
	for _, d := range p.AppendDatabaseStat(nil) {
		used, idle = used+int64(d.InUse), idle+int64(d.Idle)
		if d.Open == 0 {
			continue
		}
		attrs := append(t.poolAttrs[:len(t.poolAttrs):len(t.poolAttrs)], semconv.DBNamespace(d.Database))
		if d.Server != "" {
			attrs = append(attrs, ServerKey.String(d.Server)) // one database name may be on several servers
		}
		o.ObserveInt64(t.dbCount, int64(d.InUse), metric.WithAttributes(append(attrs, semconv.DBClientConnectionStateUsed)...))
		o.ObserveInt64(t.dbCount, int64(d.Idle), metric.WithAttributes(append(attrs, semconv.DBClientConnectionStateIdle)...))
	}
	o.ObserveInt64(t.connCount, used, t.usedObs...)
	o.ObserveInt64(t.connCount, idle, t.idleObs...)
	o.ObserveInt64(t.connMax, int64(st.Budget), t.poolObs...)
	o.ObserveInt64(t.dbOpens, st.Opens, t.poolObs...)
	o.ObserveInt64(t.dbCloses, st.Closes, t.poolObs...)
	o.ObserveFloat64(t.dbOpenTime, st.ConnectTime.Seconds(), t.poolObs...)
	for _, s := range p.ServersStat() {
		obs := metric.WithAttributes(append(t.poolAttrs[:len(t.poolAttrs):len(t.poolAttrs)], ServerKey.String(s.Server))...)
		down := int64(0)
		if s.Down {
			down = 1
		}
		o.ObserveInt64(t.srvCount, int64(s.Open), obs)
		o.ObserveInt64(t.srvMax, int64(s.Budget), obs)
		o.ObserveInt64(t.srvDown, down, obs)
		for _, r := range s.Replicas { // a series of the server metrics each, named "eu1/replica0"
			obs := metric.WithAttributes(append(t.poolAttrs[:len(t.poolAttrs):len(t.poolAttrs)], ServerKey.String(r.Name))...)
			unusable := int64(1)
			if r.Usable {
				unusable = 0
			}
			o.ObserveInt64(t.srvCount, int64(r.Open), obs)
			o.ObserveInt64(t.srvMax, int64(r.Budget), obs)
			o.ObserveInt64(t.srvDown, unusable, obs)
			if r.Lag >= 0 {
				o.ObserveFloat64(t.replicaLag, r.Lag.Seconds(), obs)
			}
		}
	}
}

// ObserveGate is ObservePool for a bare pool.Gate, which bulkheads something
// other than a pgxpool: db.client.connection.count reports permits in use
// as state "used" (a Gate has no idle connections) and
// db.client.connection.max its capacity.
func (t *Tracer) ObserveGate(g *pool.Gate) (stop func() error, err error) {
	if g == nil {
		return nil, errors.New("tracing: ObserveGate: nil gate")
	}
	return t.observe(g, func(o metric.Observer) {
		o.ObserveInt64(t.connCount, int64(g.Stat().InUse), t.usedObs...)
		o.ObserveInt64(t.connMax, int64(g.Capacity()), t.poolObs...)
	})
}

// observe registers the callback shared by ObservePool and ObserveGate;
// conns observes what differs.
func (t *Tracer) observe(g *pool.Gate, conns func(metric.Observer)) (func() error, error) {
	t.mu.Lock()
	if t.observing {
		t.mu.Unlock()
		return nil, ErrObserving
	}
	t.observing = true
	t.mu.Unlock()

	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		conns(o)
		gs := g.Stat()
		o.ObserveInt64(t.connPending, int64(gs.Waiting), t.poolObs...)
		t.observeClasses(o, gs.Classes)
		// A fresh slice each time: with several readers the SDK may run
		// this callback concurrently, and collections are rare.
		for _, pt := range t.labels.collect(g.AppendTenantStat(nil)) {
			o.ObserveInt64(t.tenantCount, pt.inUse, pt.obs...)
			o.ObserveInt64(t.tenantPending, pt.waiting, pt.obs...)
			if pt.limit >= 0 {
				o.ObserveInt64(t.tenantMax, pt.limit, pt.obs...)
				o.ObserveInt64(t.tenantEffectiveMax, pt.effective, pt.obs...)
			}
			if pt.budgeted {
				o.ObserveFloat64(t.tenantBudgetLeft, pt.budgetLeft, pt.obs...)
			}
		}
		return nil
	}, t.connCount, t.connMax, t.connPending, t.tenantCount, t.tenantPending, t.tenantMax, t.tenantEffectiveMax, t.tenantBudgetLeft,
		t.classCount, t.classPending, t.classMax, t.classAdmissions, t.classWait, t.classUse,
		t.dbCount, t.dbOpens, t.dbCloses, t.dbOpenTime, t.srvCount, t.srvMax, t.srvDown, t.replicaLag)
	if err != nil {
		t.mu.Lock()
		t.observing = false
		t.mu.Unlock()
		return nil, fmt.Errorf("tracing: register pool metrics: %w", err)
	}
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() {
			err = reg.Unregister()
			t.mu.Lock()
			t.observing = false
			t.mu.Unlock()
		})
		return err
	}, nil
}

// observeClasses reports the per-class gauges and totals, labelled with the
// pool name and ClassKey; admissions also with OutcomeKey. A Gate without
// classes has none to report.
func (t *Tracer) observeClasses(o metric.Observer, classes []pool.ClassStat) {
	for _, c := range classes {
		attrs := append(t.poolAttrs[:len(t.poolAttrs):len(t.poolAttrs)], ClassKey.String(c.Class))
		obs := metric.WithAttributes(attrs...)
		o.ObserveInt64(t.classCount, int64(c.InUse), obs)
		o.ObserveInt64(t.classPending, int64(c.Waiting), obs)
		o.ObserveInt64(t.classMax, int64(c.Limit), obs)
		o.ObserveFloat64(t.classWait, c.WaitTime.Seconds(), obs)
		o.ObserveFloat64(t.classUse, c.HoldTime.Seconds(), obs)
		for _, a := range [...]struct {
			o pool.Outcome
			n uint64
		}{{pool.Acquired, c.Acquired}, {pool.Rejected, c.Rejected}, {pool.TimedOut, c.TimedOut}, {pool.Cancelled, c.Cancelled}} {
			o.ObserveInt64(t.classAdmissions, int64(a.n), metric.WithAttributes(append(attrs, OutcomeKey.String(a.o.String()))...))
		}
	}
}
