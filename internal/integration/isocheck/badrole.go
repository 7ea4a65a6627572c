package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// badTenant is a tenant of the role configurations whose Session.Role does
// not exist (issue 51, 4): its calls must fail with the server's 42704 and
// close no connection another tenant would have used.
const (
	badTenant = "tbad"
	badRole   = "iso_role_missing"
)

// roleOf is Session.Role in the role configurations.
func roleOf(tenant string) string {
	if tenant == badTenant {
		return badRole
	}
	return tenantRole(tenant)
}

// destroyed is how many connections the pool has closed so far: those it
// made less those it has. pgxpool removes a connection from its count when
// it destroys it, before its close runs in a goroutine of its own, so this
// is exact once nothing is acquired (or being made: no MinConns here).
func (rc *runCtx) destroyed() int64 {
	st := rc.pool.Stat()
	return st.NewConnsCount() - int64(st.TotalConns())
}

// execBadRole runs o, two calls of badTenant, alone: the worker holds the
// run's exclusive lock, so no other op and no fault runs meanwhile. Every
// connection is first taken by good tenants, a statement run on each, and
// given back, so that each is working and reset (a broken one, or a dirty
// session whose reset fails, is closed then, rightly); then no connection
// may close while the bad tenant's calls run and their connections go back.
func (rc *runCtx) execBadRole(o op) []string {
	if !rc.cleanIdle() {
		return nil // the pool did not come to rest: nothing can be told
	}
	before := rc.destroyed()
	deaths := rc.bouncerDeaths()
	var bad []string
	for range 2 {
		ctx, cancel := context.WithTimeout(tenantdb.WithTenant(rc.ctx, badTenant), 20*time.Second)
		p := o.hPath
		if p == pathConnTx {
			p = pathAcquire // its BEGIN's error is judged inside, as another tenant's
		}
		err, _ := rc.send(ctx, o, p, "select 1", nil, false)
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			bad = append(bad, fmt.Sprintf("tenant %s, whose role %s does not exist, ran a statement", badTenant, badRole))
		case errors.As(err, &pgErr) && (pgErr.Code == "42704" || pgErr.Code == "22023") && strings.Contains(pgErr.Message, badRole):
		case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		default:
			bad = append(bad, fmt.Sprintf("tenant %s's bad role: unexpected error: %v", badTenant, err))
		}
		cancel()
	}
	if !rc.rest() {
		return bad
	}
	if rc.bouncerDeaths() != deaths {
		return nil // PgBouncer died meanwhile (bouncer.go): its connections broke, nothing can be told
	}
	if n := rc.destroyed() - before; n > 0 {
		bad = append(bad, fmt.Sprintf("tenant %s, whose role does not exist, closed %d connections of the shared pool", badTenant, n))
	}
	return bad
}

// bouncerDeaths counts the deaths of the pooler run's PgBouncer, after
// checking that it is alive (and starting another if it is not).
func (rc *runCtx) bouncerDeaths() int {
	if !rc.cfg.pooler || rc.env.bouncer == nil {
		return 0
	}
	rc.reviveBouncer()
	n, _ := rc.env.bouncer.died()
	return n
}

// rest waits until no connection of the pool is acquired (a release's
// AfterRelease, which may close it, has returned), polling the pool's stats.
func (rc *runCtx) rest() bool {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if rc.pool.Stat().AcquiredConns() == 0 {
			return true
		}
		time.Sleep(10 * time.Millisecond) // polling the pool's own stats, not synchronising
	}
	return false
}

// cleanIdle takes every connection of the pool at once for good tenants,
// runs a statement on each and gives them back: each is reset at release,
// and a dirty one that cannot be is closed now, not in the bad tenant's calls.
// It reports false when it could not take them all (a hostile ALTER ROLE
// refuses new connections for a while) or the pool did not come to rest.
func (rc *runCtx) cleanIdle() bool {
	if !rc.rest() {
		return false
	}
	n := int(rc.pool.Stat().MaxConns())
	var held []tenantdb.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for i := 0; len(held) < n && i < 2*n; i++ {
		t := rc.env.tenants[i%numTenants]
		ctx, cancel := context.WithTimeout(tenantdb.WithTenant(rc.ctx, t), 5*time.Second)
		c, err := rc.pool.Acquire(ctx)
		if err == nil {
			if _, err = c.Exec(ctx, "select 1"); err != nil {
				c.Release()
			} else {
				held = append(held, c)
			}
		}
		cancel()
	}
	all := len(held) == n // else a connection may be left dirty: nothing can be told
	for _, c := range held {
		c.Release()
	}
	held = nil
	return rc.rest() && all
}
