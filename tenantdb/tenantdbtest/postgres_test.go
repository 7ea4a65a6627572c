package tenantdbtest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

func TestPostgresAnswersAndAppliesOptions(t *testing.T) {
	t.Parallel()
	pg := tenantdbtest.StartPostgres(t,
		tenantdbtest.WithInitScripts("testdata/init.sql"),
		tenantdbtest.WithCredentials("alice", "s3cret:/@?"),
		tenantdbtest.WithDatabase("orders"),
		tenantdbtest.WithMaxConnections(250),
	)
	if pg.Container == nil || pg.Image == "" {
		t.Fatalf("StartPostgres started no container: %+v", pg)
	}
	if !strings.HasPrefix(pg.DSN, "postgres://alice:") || !strings.Contains(pg.DSN, "/orders?sslmode=disable") {
		t.Errorf("DSN = %q, want the user, database and sslmode=disable", pg.DSN)
	}

	var conn *pgx.Conn
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "connect", func(ctx context.Context) (err error) {
		conn, err = pgx.Connect(ctx, pg.DSN)
		return err
	})
	defer conn.Close(context.Background())

	ctx := t.Context()
	var version, maxConns, fsync, user, db, note string
	if err := conn.QueryRow(ctx, "select version()").Scan(&version); err != nil {
		t.Fatalf("select version(): %v", err)
	}
	if !strings.HasPrefix(version, "PostgreSQL 15") {
		t.Errorf("version() = %q, want PostgreSQL 15", version)
	}
	t.Logf("version(): %s", version)
	if err := conn.QueryRow(ctx, "select current_setting('max_connections'), current_setting('fsync'), current_user, current_database()").
		Scan(&maxConns, &fsync, &user, &db); err != nil {
		t.Fatal(err)
	}
	if maxConns != "250" || fsync != "off" || user != "alice" || db != "orders" {
		t.Errorf("max_connections=%s fsync=%s user=%s db=%s, want 250 off alice orders", maxConns, fsync, user, db)
	}
	if err := conn.QueryRow(ctx, "select note from tenantdbtest_init where id = 1").Scan(&note); err != nil {
		t.Errorf("table from the init script: %v", err)
	}
}

func TestPostgresDefaultsAllowManyConnections(t *testing.T) {
	t.Parallel()
	pg := tenantdbtest.StartPostgres(t)
	var conn *pgx.Conn
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "connect", func(ctx context.Context) (err error) {
		conn, err = pgx.Connect(ctx, pg.DSN)
		return err
	})
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), "select current_setting('max_connections')::int").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n < 200 {
		t.Errorf("max_connections = %d, want at least 200", n)
	}
}

func TestPostgresSurvivesStopStartWithSameDSN(t *testing.T) {
	t.Parallel()
	pg := tenantdbtest.StartPostgres(t)
	dsn, addr := pg.DSN, pg.Addr

	pool, err := pgxpool.New(t.Context(), pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "create table", func(ctx context.Context) error {
		_, err := pool.Exec(ctx, "create table if not exists kept (v text); insert into kept values ('before restart')")
		return err
	})

	if err := pg.Stop(t.Context()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	if err := pool.Ping(ctx); err == nil {
		t.Errorf("Ping succeeded while the server was stopped")
	}
	cancel()

	if err := pg.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if pg.DSN != dsn || pg.Addr != addr {
		t.Fatalf("DSN changed across Stop/Start: %q -> %q", dsn, pg.DSN)
	}
	port, err := pg.Container.MappedPort(t.Context(), "5432/tcp")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(addr, ":"+port.Port()) {
		t.Fatalf("after Start Docker maps 5432 to %s, but Addr is %s", port.Port(), addr)
	}

	// The pool made before the restart recovers on its own: broken
	// connections are dropped and new ones dialled at the same DSN.
	var v string
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "query after restart", func(ctx context.Context) error {
		return pool.QueryRow(ctx, "select v from kept").Scan(&v)
	})
	if v != "before restart" {
		t.Errorf("row after restart = %q, want %q", v, "before restart")
	}
}

func TestPostgresPauseHangsClientsUntilUnpause(t *testing.T) {
	t.Parallel()
	pg := tenantdbtest.StartPostgres(t)
	pool, err := pgxpool.New(t.Context(), pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "ping", func(ctx context.Context) error { return pool.Ping(ctx) })

	if err := pg.Pause(t.Context()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	_, err = pool.Exec(ctx, "select 1")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("query on a paused server: err = %v, want a deadline exceeded", err)
	}
	if err := pg.Unpause(t.Context()); err != nil {
		t.Fatalf("Unpause: %v", err)
	}
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "query after unpause", func(ctx context.Context) error {
		_, err := pool.Exec(ctx, "select 1")
		return err
	})
}

func TestPostgresExistingServerFromEnv(t *testing.T) {
	pg := tenantdbtest.StartPostgres(t)

	t.Setenv("TENANTDB_POSTGRES_DSN", pg.DSN)
	existing := tenantdbtest.StartPostgres(t, tenantdbtest.WithMaxConnections(10))
	if existing.Container != nil || existing.DSN != pg.DSN {
		t.Fatalf("with TENANTDB_POSTGRES_DSN set: Container=%v DSN=%q, want nil and %q", existing.Container, existing.DSN, pg.DSN)
	}
	if existing.Addr != pg.Addr || existing.User != pg.User || existing.Database != pg.Database {
		t.Errorf("parts of the DSN: got %s %s %s, want %s %s %s",
			existing.Addr, existing.User, existing.Database, pg.Addr, pg.User, pg.Database)
	}
	for name, f := range map[string]func(context.Context) error{
		"Stop": existing.Stop, "Start": existing.Start, "Restart": existing.Restart,
		"Pause": existing.Pause, "Unpause": existing.Unpause,
	} {
		if err := f(t.Context()); !errors.Is(err, tenantdbtest.ErrNoContainer) {
			t.Errorf("%s on an existing server: err = %v, want ErrNoContainer", name, err)
		}
	}
	if err := existing.Terminate(t.Context()); err != nil {
		t.Errorf("Terminate on an existing server: %v", err)
	}

	run, err := tenantdbtest.RunPostgres(t.Context())
	if err != nil || run.DSN != pg.DSN || run.Container != nil {
		t.Errorf("RunPostgres with TENANTDB_POSTGRES_DSN set: %+v, %v", run, err)
	}
}

func TestPostgresRunAndTerminate(t *testing.T) {
	t.Parallel()
	pg, err := tenantdbtest.RunPostgres(t.Context())
	if err != nil {
		t.Fatalf("RunPostgres: %v", err)
	}
	id := pg.Container.GetContainerID()
	if err := pg.Terminate(context.Background()); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	if err := pg.Terminate(context.Background()); err != nil {
		t.Errorf("second Terminate: %v", err)
	}
	out, err := exec.Command("docker", "ps", "-a", "-q", "--no-trunc", "--filter", "id="+id).Output()
	if err == nil && strings.TrimSpace(string(out)) != "" {
		t.Errorf("container %s still exists after Terminate", id)
	}
}

// TestPostgresWithoutDockerFails runs this test binary again with Docker
// out of reach (testcontainers caches the Docker host per process): the
// helper must fail the test, not skip it, and say what to do.
func TestPostgresWithoutDockerFails(t *testing.T) {
	if os.Getenv("TENANTDBTEST_CHILD_NO_DOCKER") == "1" {
		tenantdbtest.StartPostgres(t)
		t.Log("StartPostgres returned without Docker")
		return
	}
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestPostgresWithoutDockerFails$", "-test.v")
	cmd.Env = append(os.Environ(),
		"TENANTDBTEST_CHILD_NO_DOCKER=1",
		"DOCKER_HOST=unix:///nonexistent/tenantdbtest/docker.sock",
		"TENANTDB_POSTGRES_DSN=",
	)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child test without Docker: err = %v, want it to fail; output:\n%s", err, out)
	}
	s := string(out)
	if strings.Contains(s, "--- SKIP") || !strings.Contains(s, "--- FAIL") {
		t.Errorf("child test was not failed:\n%s", s)
	}
	for _, want := range []string{"needs Docker", "TENANTDB_POSTGRES_DSN"} {
		if !strings.Contains(s, want) {
			t.Errorf("failure message lacks %q:\n%s", want, s)
		}
	}
}
