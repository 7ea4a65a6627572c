package tenantdbtest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// connectBounced connects through PgBouncer with the extended protocol's
// unnamed statements (QueryExecModeExec): PgBouncer 1.18, Debian bookworm's,
// does not track named prepared statements in transaction pooling.
func connectBounced(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	c, err := pgx.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// TestPgBouncerPoolModes shows that the options reach PgBouncer: with one
// server connection in transaction pooling, a session setting made by one
// client is seen by another (PgBouncer resets nothing between them); in
// session pooling, the next client gets a server connection cleaned by
// DISCARD ALL.
func TestPgBouncerPoolModes(t *testing.T) {
	t.Parallel()
	pg := tenantdbtest.StartPostgres(t)
	admin, err := pgx.Connect(t.Context(), pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(t.Context(), "create role bouncer_app login password 'app-pw'"); err != nil {
		t.Fatal(err)
	}

	for _, mode := range []string{tenantdbtest.PoolModeTransaction, tenantdbtest.PoolModeSession} {
		t.Run(mode, func(t *testing.T) {
			b := tenantdbtest.StartPgBouncer(t, pg,
				tenantdbtest.WithPoolMode(mode),
				tenantdbtest.WithPoolSize(1),
				tenantdbtest.WithPgBouncerUser("bouncer_app", "app-pw"),
			)
			if b.Version == "" {
				t.Error("no version")
			}
			ctx := t.Context()
			read := func(c *pgx.Conn) (setting string, pid int) {
				t.Helper()
				err := c.QueryRow(ctx, "select current_setting('tdbt.x', true), pg_backend_pid()").Scan(&setting, &pid)
				if err != nil {
					t.Fatal(err)
				}
				return setting, pid
			}

			first := connectBounced(t, b.DSNFor("bouncer_app", "app-pw"))
			if _, err := first.Exec(ctx, "select set_config('tdbt.x', $1, false)", "left by first"); err != nil {
				t.Fatal(err)
			}
			_, firstPID := read(first)
			if mode == tenantdbtest.PoolModeSession {
				// The one server connection is first's until it leaves.
				first.Close(ctx)
			}
			second := connectBounced(t, b.DSNFor("bouncer_app", "app-pw"))
			setting, pid := read(second)
			if pid != firstPID {
				t.Fatalf("second client on backend %d, first on %d: want the one server connection", pid, firstPID)
			}
			want := map[string]string{tenantdbtest.PoolModeTransaction: "left by first", tenantdbtest.PoolModeSession: ""}[mode]
			if setting != want {
				t.Fatalf("second client sees tdbt.x = %q, want %q", setting, want)
			}

			// The admin console answers as the Postgres's own user.
			console, err := pgx.ParseConfig(b.AdminDSN)
			if err != nil {
				t.Fatal(err)
			}
			console.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
			ac, err := pgx.ConnectConfig(ctx, console)
			if err != nil {
				t.Fatal(err)
			}
			defer ac.Close(context.Background())
			rows, err := ac.Query(ctx, "SHOW POOLS")
			if err != nil {
				t.Fatal(err)
			}
			modes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
				m, err := pgx.RowToMap(r)
				return fmt.Sprint(m["database"], "/", m["user"], "/", m["pool_mode"]), err
			})
			if err != nil {
				t.Fatal(err)
			}
			wantPool := pg.Database + "/bouncer_app/" + mode
			found := false
			for _, m := range modes {
				found = found || m == wantPool
			}
			if !found {
				t.Fatalf("SHOW POOLS: %v, want %s", modes, wantPool)
			}

			if err := b.Terminate(); err != nil {
				t.Fatal(err)
			}
			if c, err := pgx.Connect(ctx, b.DSN); err == nil {
				c.Close(ctx)
				t.Fatal("connected after Terminate")
			}
		})
	}
}
