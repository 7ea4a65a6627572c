package tracing_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/internal/integration/testmain"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// The PostgreSQL container is started by the first test that needs one and
// shared by the rest, so that the in-memory tests run without Docker.
var (
	pgOnce   sync.Once
	sharedPG *tenantdbtest.Postgres
	pgErr    error
)

func postgres(t testing.TB) *tenantdbtest.Postgres {
	t.Helper()
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		sharedPG, pgErr = tenantdbtest.RunPostgres(ctx)
	})
	if pgErr != nil {
		t.Fatalf("start PostgreSQL: %v", pgErr)
	}
	return sharedPG
}

func TestMain(m *testing.M) {
	code := m.Run() // before sharedPG is read: the tests may start it
	testmain.Exit(code, sharedPG)
}
