package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A database dropped and created again (the Config.Database
// configurations): a tenant's database is dropped while its calls run, its
// backends ended (DROP DATABASE ... WITH (FORCE)), and created again from a
// template of its own a moment later, with the same marker row. Meanwhile
// that tenant's calls may fail as docs/databases.md says (the server's
// 3D000, wrapped; the same error for a second after), never run in
// another database: the probe's current_database() and the audit say so.

// templateDatabase is the database a tenant's database is created again from.
func templateDatabase(tenant string) string { return "isotmpl_" + tenant }

// dropWindow is when a tenant's database was missing, with the second the
// Pool may keep answering with the failure, and some slack.
type dropWindow struct{ from, to time.Time }

// dropDatabase drops the database of a random tenant and creates it again
// after 50 to 500 ms. The admin statements run on a context of their own:
// a run that ends meanwhile still gets its database back.
func (rc *runCtx) dropDatabase(r *rand.Rand) error {
	ti := r.IntN(numTenants)
	t := rc.env.tenants[ti]
	pause := time.Duration(50+r.IntN(450)) * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc.adminMu.Lock() // not while the undo of an ALTER ROLE names this database
	defer rc.adminMu.Unlock()
	rc.mu.Lock()
	w := &dropWindow{from: time.Now(), to: time.Now().Add(time.Hour)}
	rc.drops[t] = append(rc.drops[t], w)
	rc.mu.Unlock()
	rc.faulting.Store(true)
	defer rc.faulting.Store(false)
	var err error
	for try := 0; try < 5; try++ { // a connection may come between the FORCE and the drop
		if _, err = rc.adminPool.Exec(ctx, "drop database if exists "+tenantDatabase(t)+" with (force)"); err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("drop %s: %w", tenantDatabase(t), err)
	}
	time.Sleep(pause)              // the fault's length: calls meet the missing database meanwhile
	for try := 0; try < 5; try++ { // the template may be busy for a moment
		if _, err = rc.adminPool.Exec(ctx, "create database "+tenantDatabase(t)+" template "+templateDatabase(t)); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	rc.faultUntil(time.Now().Add(2 * time.Second))
	rc.mu.Lock()
	w.to = time.Now().Add(2 * time.Second)
	rc.mu.Unlock()
	rc.dbDrops.Add(1)
	rc.faults.Add(1)
	if err != nil {
		return fmt.Errorf("create %s again: %w", tenantDatabase(t), err)
	}
	return nil
}

// droppedSince reports whether tenant's database was missing (or the Pool
// may still answer so) at some time since started.
func (rc *runCtx) droppedSince(tenant string, started time.Time) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, w := range rc.drops[tenant] {
		if w.to.After(started) {
			return true
		}
	}
	return false
}

// missingDatabase reports whether err is the server's answer for a database
// that is missing or being dropped or created.
func missingDatabase(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "3D000" || pgErr.Code == "55000" || pgErr.Code == "55006")
}
