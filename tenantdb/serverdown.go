package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrServerDown is matched by the error of a call whose tenant's server
// (NewServers) is known to be down: a connect to it failed lately without
// an answer from PostgreSQL (refused, reset, or no login within its
// connect_timeout while the call still had time). Such calls fail at once,
// without connecting, with the last failure; one call a second tries
// again, and the first that connects ends it. Other servers' tenants are
// not affected.
var ErrServerDown = errors.New("tenantdb: server down")

// connectCause is a failed connect kept for a server known down, which
// the calls of the server's other tenants fail with: its text is what
// failed (the address, the network's or the server's error), without the
// tenant, database and user of the call that saw it; errors.As still
// finds the whole.
type connectCause struct{ err error }

func (c connectCause) Error() string {
	var ce *pgconn.ConnectError
	if errors.As(c.err, &ce) {
		if inner := ce.Unwrap(); inner != nil {
			return "a connect failed: " + inner.Error()
		}
		return "a connect failed"
	}
	return c.err.Error()
}

func (c connectCause) Unwrap() error { return c.err }

// downHold is how long a server whose connect failed fails its tenants'
// calls without connecting, before one call tries again.
const downHold = failHold

// downState is a server's last failed connect and until when its calls
// fail without connecting.
type downState struct {
	err   error
	since time.Time
	until time.Time
}

// serverDown reports whether err, the failed connect of a call whose
// context is ctx, says the server is unreachable: a ConnectError without
// a PostgreSQL error in it, not a wait for room in the budget, and not the
// call's own context ending (connect_timeout's may).
func serverDown(ctx context.Context, err error) bool {
	var ce *pgconn.ConnectError
	var pe *pgconn.PgError
	return errors.As(err, &ce) && !errors.As(err, &pe) && !errors.Is(err, errNoRoom) && ctx.Err() == nil
}

// markDown records that server d is down after a call's failed connect.
func (d *databases) markDown(err error) {
	now := time.Now()
	since := now
	if old := d.down.Load(); old != nil {
		since = old.since
	}
	d.down.Store(&downState{err: err, since: since, until: now.Add(downHold)})
}

// checkDown returns ErrServerDown while server d is known down, and nil
// for every call otherwise, and for the one call a hold lets through to
// try again.
func (d *databases) checkDown() error {
	s := d.down.Load()
	if s == nil {
		return nil
	}
	now := time.Now()
	if now.After(s.until) && d.down.CompareAndSwap(s, &downState{err: s.err, since: s.since, until: now.Add(downHold)}) {
		return nil // this call tries again; the others keep failing meanwhile
	}
	return fmt.Errorf("%w: server %q, down since %v ago: %w", ErrServerDown, d.server,
		now.Sub(s.since).Round(time.Millisecond), s.err)
}

// up records that a connect to server d succeeded.
func (d *databases) up() {
	if d.down.Load() != nil {
		d.down.Store(nil)
	}
}
