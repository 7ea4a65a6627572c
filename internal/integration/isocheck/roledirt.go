package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// roleDirt tracks, for the servers configuration, the hostile defaults its
// tenants gave the login role on each server (ALTER ROLE current_user [IN
// DATABASE d] SET), from the first until the checker undoes them a few
// operations later: only then may that server refuse connections with
// tenantdb.ErrRoleDefaultsChanged, and no other server ever. The undo
// resets only the settings the hostile statements set, so that each
// server's own defaults (srvRoleDefaults) stay as tenantdb first read them.
type roleDirt struct {
	admins []*pgxpool.Pool // superuser, one per server, by index

	mu   sync.Mutex
	open map[string]*roleAlter // server -> the hostile defaults not undone yet
	wins map[string][]*window  // server -> each time it had some, until its undo returned
}

// roleAlter is one server's hostile defaults not undone yet.
type roleAlter struct {
	w       *window
	opsLeft int // before the undo
}

// roleUndoAfter is how many operations after the first hostile default the
// checker undoes them: long enough for other tenants' new connections to
// meet them, short enough that the run does not spend itself on refusals.
const roleUndoAfter = 8

func (r *roleDirt) init(admins []*pgxpool.Pool) {
	r.admins, r.open, r.wins = admins, map[string]*roleAlter{}, map[string][]*window{}
}

// dirty records that a hostile default may be set on servers from now on;
// from is when the statement setting it was sent, or earlier.
func (r *roleDirt) dirty(servers []string, from time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range servers {
		if r.open[s] != nil {
			continue
		}
		w := &window{from: from}
		r.open[s] = &roleAlter{w: w, opsLeft: roleUndoAfter}
		r.wins[s] = append(r.wins[s], w)
	}
}

// dirtyDuring reports whether any of servers had hostile defaults at some
// time from started to now.
func (r *roleDirt) dirtyDuring(servers []string, started, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range servers {
		for _, w := range r.wins[s] {
			if w.overlaps(started, now) {
				return true
			}
		}
	}
	return false
}

// afterOp counts one operation, and undoes the hostile defaults of each
// server whose count ran out. A statement that sets them again after the
// undo is recorded again by its second dirty (servers.go), from before it
// was sent.
func (r *roleDirt) afterOp(ctx context.Context) {
	r.mu.Lock()
	var due []string
	for s, a := range r.open {
		if a.opsLeft--; a.opsLeft == 0 {
			due = append(due, s)
		}
	}
	r.mu.Unlock()
	for _, s := range due {
		err := r.undo(ctx, serverIndex(s))
		r.mu.Lock()
		if err == nil || ctx.Err() != nil {
			r.open[s].w.to = time.Now()
			delete(r.open, s)
		} else {
			r.open[s].opsLeft = roleUndoAfter // try again later
		}
		r.mu.Unlock()
	}
}

// undoAll undoes the hostile defaults of every server.
func (r *roleDirt) undoAll(ctx context.Context) error {
	for i := range r.admins {
		if err := r.undo(ctx, i); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for s, a := range r.open {
		a.w.to = time.Now()
		delete(r.open, s)
	}
	return nil
}

// undo resets, on server i, the settings srvHostile's statements set.
func (r *roleDirt) undo(ctx context.Context, i int) error {
	sql := ""
	for _, param := range []string{"search_path", "default_transaction_read_only"} {
		sql += fmt.Sprintf("alter role %s reset %s;\n", loginRole, param)
		for t := range srvTenants {
			sql += fmt.Sprintf("alter role %s in database %s reset %s;\n", loginRole, srvDatabase(tenantName(t)), param)
		}
	}
	_, err := r.admins[i].Exec(ctx, sql)
	return err
}
