// Package testmain is the TestMain of packages whose tests share one
// PostgreSQL container and must leave no goroutine behind.
package testmain

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// RunWithPostgres starts PostgreSQL (tenantdbtest.RunPostgres, within five
// minutes), sets *pg to it, runs m's tests and calls Exit. It exits at once
// with status 1 when the server cannot be started.
func RunWithPostgres(m *testing.M, pg **tenantdbtest.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	started, err := tenantdbtest.RunPostgres(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*pg = started
	Exit(m.Run(), started)
}

// Exit terminates pg unless it is nil, turns a passing run that left
// goroutines behind (tenantdbtest.FindLeaks) into a failure, and exits with
// the run's code.
func Exit(code int, pg *tenantdbtest.Postgres) {
	if pg != nil {
		if err := pg.Terminate(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	if code == 0 {
		if err := tenantdbtest.FindLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}
