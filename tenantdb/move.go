package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrMoved is matched by the error of a call ended by Pool.Move: it was
// still running when the move's grace ran out, so its statement was
// cancelled on the server and its later statements fail.
var ErrMoved = errors.New("tenantdb: the call outlasted its tenant's move to another server")

// Move moves tenantID to the placement to, on a Pool made by NewServers:
//
//  1. drain: the tenant's new calls wait for it by their own queue policy
//     (Plan.MaxWaiting, MaxWait) and contexts, or are rejected as over the
//     cap when that says so; other tenants are not held;
//  2. its calls in flight finish, or after grace are ended (ErrMoved):
//     their statements cancelled on the server and their connections closed,
//     and Move waits until the server no longer lists their processes;
//  3. fence: from then on nothing of the tenant runs on its old server,
//     not even the setup of a connection a call gave up on while it opened,
//     nor the reset of a session released;
//  4. cutover(ctx), yours: copy the data, and make Config.Placement answer
//     to from now on (its next answer, after LookupTTL, is used);
//  5. switch and resume: the tenant is placed at to and its waiting calls
//     go on there.
//
// ctx bounds the whole move and is passed to cutover. If ctx ends first, or
// cutover fails or panics, the tenant resumes where it was and the error is
// returned. Each process of a fleet runs its own Pool: see docs/servers.md.
func (p *Pool) Move(ctx context.Context, tenantID string, to Placement, grace time.Duration, cutover func(ctx context.Context) error) (err error) {
	if p.servers == nil {
		return errors.New("tenantdb: Move needs a Pool made by NewServers")
	}
	if p.servers[to.Server] == nil {
		return fmt.Errorf("%w: Move of tenant %q to server %q, which is not one of the Pool's (%v)",
			ErrNoPlacement, tenantID, to.Server, p.Servers())
	}
	if to.Database != "" {
		if err := checkDatabaseName("Move", tenantID, to.Database); err != nil {
			return err
		}
	}
	if grace < 0 {
		return fmt.Errorf("tenantdb: Move of tenant %q: negative grace %v", tenantID, grace)
	}
	d, err := p.gate.Drain(ctx, tenantID)
	if err != nil {
		return fmt.Errorf("tenantdb: Move of tenant %q: %w", tenantID, err)
	}
	from, _ := p.gate.TenantStat(tenantID)
	switched := false
	defer func() {
		if !switched {
			_ = d.Resume(nil) // where it was
		}
	}()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-d.Done():
	case <-timer.C:
		pids := p.calls.end(tenantID, ErrMoved)
		select {
		case <-d.Done():
		case <-ctx.Done():
			return fmt.Errorf("tenantdb: Move of tenant %q: its calls in flight did not end: %w", tenantID, ctx.Err())
		}
		if err := p.awaitGone(ctx, from.Server, pids); err != nil {
			return fmt.Errorf("tenantdb: Move of tenant %q: server processes of its ended calls still there on server %q: %w", tenantID, from.Server, err)
		}
	case <-ctx.Done():
		return fmt.Errorf("tenantdb: Move of tenant %q: draining: %w", tenantID, ctx.Err())
	}
	if err := p.awaitConnects(ctx, tenantID, from.Server, from.Database); err != nil {
		return fmt.Errorf("tenantdb: Move of tenant %q: connections still opening on server %q: %w", tenantID, from.Server, err)
	}
	if cutover != nil {
		if err := runCutover(ctx, cutover); err != nil {
			return fmt.Errorf("tenantdb: Move of tenant %q: cutover: %w", tenantID, err)
		}
	}
	switched = true
	if err := d.Resume(&to); err != nil {
		return fmt.Errorf("tenantdb: Move of tenant %q: %w", tenantID, err)
	}
	return nil
}

// awaitConnects waits until no connection is opening to the database of
// tenant on server (database as in its placement), and no reset of its
// sessions runs: pgxpool goes on with a connect whose call gave up, and a
// release resets the session after the slot went back, both on the old
// server after the fence otherwise.
func (p *Pool) awaitConnects(ctx context.Context, tenant, server, database string) error {
	var pg *pgxpool.Pool // nil: no connection of the tenant's database is opening
	if d := p.servers[server]; d != nil {
		name, err := database, error(nil)
		if name == "" && d.name != nil {
			name, err = d.tenantDatabase(tenant) // an error: its calls failed before connecting
		}
		switch {
		case err != nil:
		case name == "":
			pg = d.admin.pg
		default:
			d.mu.Lock()
			if db := d.byName[name]; db != nil {
				pg = db.pg
			}
			d.mu.Unlock()
		}
	}
	tick := time.NewTicker(time.Millisecond) // pgxpool tells no end of a connect, nor the resets theirs
	defer tick.Stop()
	for pg != nil && pg.Stat().ConstructingConns() > 0 || p.calls.resetsOf(tenant) > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// awaitGone waits until none of pids, the server processes of calls Move
// ended, is left on server: a call ends when pgx gives up on its statement,
// and its connection is closed then, but the server process may still run
// the statement until it acts on the CancelRequest, and exits after that.
// Asked of the server itself, with its own pool (a connection of its
// budget), every few milliseconds.
func (p *Pool) awaitGone(ctx context.Context, server string, pids []uint32) error {
	d := p.servers[server]
	if len(pids) == 0 || d == nil || d.admin.pg == nil {
		return nil
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var left int
		err := d.admin.pg.QueryRow(withoutTenant(ctx), // the simple protocol: a pooler cannot split it (see checkServer)
			"select count(*) from pg_catalog.pg_stat_activity where pid = any($1)", pgx.QueryExecModeSimpleProtocol, pids).Scan(&left)
		if err != nil {
			return err
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// runCutover calls cutover, a panic in it being its error.
func runCutover(ctx context.Context, cutover func(context.Context) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return cutover(ctx)
}

// inflight holds the guards of each tenant's calls in flight, so that
// Move can end them.
type inflight struct {
	mu       sync.Mutex
	byTenant map[string]map[*revokeGuard]struct{} // guarded by mu
	resets   map[string]int                       // guarded by mu: resets of each tenant's sessions running after its calls
}

// resetting returns the hook by which a release tells of a reset of
// tenant's session that runs after the call's slot went back; nil without
// NewServers.
func (f *inflight) resetting(tenant string) func() func() {
	if f == nil {
		return nil
	}
	return func() func() {
		f.mu.Lock()
		if f.resets == nil {
			f.resets = make(map[string]int)
		}
		f.resets[tenant]++
		f.mu.Unlock()
		return func() {
			f.mu.Lock()
			if f.resets[tenant]--; f.resets[tenant] == 0 {
				delete(f.resets, tenant)
			}
			f.mu.Unlock()
		}
	}
}

// resetsOf counts the resets of tenant's sessions running now.
func (f *inflight) resetsOf(tenant string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resets[tenant]
}

func (f *inflight) add(tenant string, g *revokeGuard) {
	if f == nil || g == nil {
		return
	}
	f.mu.Lock()
	if f.byTenant == nil {
		f.byTenant = make(map[string]map[*revokeGuard]struct{})
	}
	set := f.byTenant[tenant]
	if set == nil {
		set = make(map[*revokeGuard]struct{})
		f.byTenant[tenant] = set
	}
	set[g] = struct{}{}
	f.mu.Unlock()
}

func (f *inflight) remove(tenant string, g *revokeGuard) {
	if f == nil || g == nil {
		return
	}
	f.mu.Lock()
	if set := f.byTenant[tenant]; set != nil {
		delete(set, g)
		if len(set) == 0 {
			delete(f.byTenant, tenant)
		}
	}
	f.mu.Unlock()
}

// end revokes every call of tenant in flight with cause, outside the lock.
func (f *inflight) end(tenant string, cause error) (pids []uint32) {
	f.mu.Lock()
	guards := make([]*revokeGuard, 0, len(f.byTenant[tenant]))
	for g := range f.byTenant[tenant] {
		guards = append(guards, g)
	}
	f.mu.Unlock()
	for _, g := range guards {
		if pid := g.serverPID(); pid != 0 {
			pids = append(pids, pid)
		}
		g.revoke(cause)
	}
	return pids
}
