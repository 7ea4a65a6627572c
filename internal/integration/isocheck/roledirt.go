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
	w        *window
	opsLeft  int // before the undo; -1 while it runs
	inflight int // hostile statements sent to the server and not returned yet
	begun    int // hostile statements sent to the server since the window opened
}

// roleUndoAfter is how many operations after the first hostile default the
// checker undoes them: long enough for other tenants' new connections to
// meet them, short enough that the run does not spend itself on refusals.
const roleUndoAfter = 8

func (r *roleDirt) init(admins []*pgxpool.Pool) {
	r.admins, r.open, r.wins = admins, map[string]*roleAlter{}, map[string][]*window{}
}

// begin records that a hostile statement setting defaults is about to be
// sent to one of servers: from now on any of them may have them, until an
// undo that no such statement ran beside. end says it returned.
func (r *roleDirt) begin(servers []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range servers {
		a := r.open[s]
		if a == nil {
			a = &roleAlter{w: &window{from: time.Now()}, opsLeft: roleUndoAfter}
			r.open[s] = a
			r.wins[s] = append(r.wins[s], a.w)
		}
		a.inflight++
		a.begun++
	}
}

// end records that the statement begin announced for servers returned.
func (r *roleDirt) end(servers []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range servers {
		r.open[s].inflight-- // open: a window is not closed while a statement is in flight
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
// server whose count ran out and to which no hostile statement is in
// flight (it could commit after the undo's reset). The window stays open
// when one was sent during the undo.
func (r *roleDirt) afterOp(ctx context.Context) {
	r.mu.Lock()
	var due []string
	begun := map[string]int{}
	for s, a := range r.open {
		if a.opsLeft > 0 {
			a.opsLeft--
		}
		if a.opsLeft == 0 && a.inflight == 0 {
			a.opsLeft = -1 // being undone: not due again meanwhile
			due = append(due, s)
			begun[s] = a.begun
		}
	}
	r.mu.Unlock()
	for _, s := range due {
		err := r.undo(ctx, serverIndex(s))
		r.mu.Lock()
		a := r.open[s]
		if (err == nil || ctx.Err() != nil) && a.begun == begun[s] {
			a.w.to = time.Now()
			delete(r.open, s)
		} else {
			a.opsLeft = roleUndoAfter // again later
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
		for _, db := range srvDatabases() {
			sql += fmt.Sprintf("alter role %s in database %s reset %s;\n", loginRole, db, param)
		}
	}
	_, err := r.admins[i].Exec(ctx, sql)
	return err
}
