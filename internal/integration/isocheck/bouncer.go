package main

import (
	"context"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// bouncerFront is the PgBouncer of a pooler run behind a pass-through
// proxy of the checker's own (it never injects faults there), so that a
// PgBouncer that dies is replaced at the same address: PgBouncer 1.18 dies
// under this workload ("server_proto: server in bad state: 11", after
// cancel requests), a bug of its own, which the run counts as a fault.
type bouncerFront struct {
	e  *env
	px *proxy

	mu       sync.Mutex
	b        *tenantdbtest.PgBouncer // guarded by mu
	restarts int                     // guarded by mu
	lastLog  string                  // guarded by mu: the log of the last one that died
}

func startBouncerFront(ctx context.Context, e *env) (*bouncerFront, error) {
	b, err := startBouncer(ctx, e)
	if err != nil {
		return nil, err
	}
	px, err := startProxy(b.Addr, 3)
	if err != nil {
		b.Terminate()
		return nil, err
	}
	return &bouncerFront{e: e, px: px, b: b}, nil
}

// dsn is the login role's DSN through the proxy.
func (f *bouncerFront) dsn() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	u, _ := url.Parse(f.b.DSNFor(loginRole, loginPass))
	u.Host = f.px.addr()
	return u.String()
}

// revive reports whether PgBouncer had died, after starting another behind
// the proxy; ok is false when that failed.
func (f *bouncerFront) revive() (died, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, err := net.DialTimeout("tcp", f.b.Addr, 2*time.Second); err == nil {
		c.Close()
		return false, true
	}
	f.lastLog = f.b.Log()
	f.b.Terminate()
	b, err := startBouncer(context.Background(), f.e)
	if err != nil {
		return true, false
	}
	f.b = b
	f.px.setTarget(b.Addr)
	f.restarts++
	return true, true
}

// died returns how many times PgBouncer died and was started again, and
// the log of the last that died.
func (f *bouncerFront) died() (int, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.restarts, f.lastLog
}

func (f *bouncerFront) close() {
	f.px.close()
	f.mu.Lock()
	f.b.Terminate()
	f.mu.Unlock()
}

// reviveBouncer starts another PgBouncer if the pooler run's died, a fault
// whose errors are excused for a moment; it reports false, and stops the
// run, when it cannot.
func (rc *runCtx) reviveBouncer() bool {
	rc.faulting.Store(true)
	defer rc.faulting.Store(false)
	died, ok := rc.env.bouncer.revive()
	if died {
		rc.faults.Add(1)
		rc.faultUntil(time.Now().Add(2 * time.Second))
	}
	if !ok {
		rc.poolerDied.Store(true)
	}
	return ok
}
