package tenantdb_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// A hand-built pgxpool.Config fails as pgxpool.NewWithConfig fails with it,
// not with a nil-pointer dereference.
func TestNewRequiresConfigFromParseConfig(t *testing.T) {
	for name, cfg := range map[string]*pgxpool.Config{
		"empty":                        {},
		"with MaxConns, no ConnConfig": {MaxConns: 4},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if got := recover(); got != "config must be created by ParseConfig" {
					t.Errorf("tenantdb.New panicked with %v, want pgxpool's %q", got, "config must be created by ParseConfig")
				}
			}()
			_, _ = tenantdb.New(context.Background(), cfg, tenantdb.Config{})
		})
	}
}
