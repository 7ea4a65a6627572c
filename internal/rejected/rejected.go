// Package rejected tells when to acquire again after pgxpool gave up because
// the PrepareConn hook refused every connection it tried. tenantdb's hook
// refuses a session left to its next holder that cannot be reset (it
// listened), and pgxpool gives up after MaxConns + 1 of those, each of which
// it destroyed: without a second acquire, another tenant's leftovers would
// fail the call.
package rejected

import (
	"context"
	"strings"
)

// rounds bounds the acquires of one call: each round destroyed MaxConns + 1
// refused connections, and tenantdb never refuses a new connection.
const rounds = 3

// pgxpoolMessage starts the error pgxpool returns when it gave up, which pgx
// exports no value for; a test in internal/integration/tenantdb pins it.
const pgxpoolMessage = "pgxpool: too many failed attempts acquiring connection"

// Again reports whether an acquire that returned err, the round-th of its
// call, is to be made again: pgxpool gave up, ctx is alive, and fewer than
// rounds were made.
func Again(ctx context.Context, err error, round int) bool {
	return err != nil && round < rounds && ctx.Err() == nil && GaveUp(err)
}

// GaveUp reports whether err is pgxpool's, returned when it gave up after
// MaxConns + 1 connections refused or destroyed on acquire.
func GaveUp(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), pgxpoolMessage)
}
