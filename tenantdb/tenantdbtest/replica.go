package tenantdbtest

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/testcontainers/testcontainers-go"
	tcexec "github.com/testcontainers/testcontainers-go/exec"
)

// StartReplica returns a streaming replica of primary (a hot standby that
// serves reads), started in a container of primary's image that is
// terminated when t ends. The replica copies primary with pg_basebackup -R
// over the Docker network, as primary's superuser, after StartReplica lets
// that user connect for replication (a pg_hba.conf line, then a reload);
// primary needs PostgreSQL's defaults wal_level=replica and
// max_wal_senders above 0. The replica's DSN has primary's credentials and
// database. opts apply to the replica as to StartPostgres (WithSetting,
// WithMaxConnections, WithCPUSet); the credentials and database are
// primary's. It fails t for an existing server (TENANTDB_POSTGRES_DSN),
// which has no container.
func StartReplica(t testing.TB, primary *Postgres, opts ...PostgresOption) *Postgres {
	t.Helper()
	if primary.Container == nil {
		t.Fatalf("tenantdbtest: StartReplica needs a primary in a container, not an existing server (%s)", postgresDSNEnv)
	}
	s := startForTest(t, func(ctx context.Context) (*Postgres, error) { return runReplica(ctx, primary, opts) })
	t.Logf("tenantdbtest: replica of %s at %s", primary.Addr, s.Addr)
	return s
}

// RunReplica is StartReplica for programs outside tests: ctx governs
// starting the container only. The caller must call Terminate when done;
// on error no container is left running.
func RunReplica(ctx context.Context, primary *Postgres, opts ...PostgresOption) (*Postgres, error) {
	if primary.Container == nil {
		return nil, fmt.Errorf("tenantdbtest: RunReplica needs a primary in a container, not an existing server (%s)", postgresDSNEnv)
	}
	return runForProgram(ctx, func(ctx context.Context) (*Postgres, error) { return runReplica(ctx, primary, opts) })
}

// runReplica lets primary's superuser connect for replication and starts
// the replica's container.
func runReplica(ctx context.Context, primary *Postgres, opts []PostgresOption) (*Postgres, error) {
	allow := fmt.Sprintf(`grep -q '^host replication all all' "$PGDATA/pg_hba.conf" || `+
		`echo 'host replication all all scram-sha-256' >> "$PGDATA/pg_hba.conf"; `+
		`psql -q -U %s -d %s -c 'select pg_reload_conf()'`, shellQuote(primary.User), shellQuote(primary.Database))
	code, out, err := primary.Container.Exec(ctx, []string{"bash", "-c", allow}, tcexec.Multiplexed())
	if err != nil || code != 0 {
		var said []byte
		if out != nil {
			said, _ = io.ReadAll(out)
		}
		return nil, fmt.Errorf("tenantdbtest: allow replication on the primary (exit %d): %v %s", code, err, said)
	}
	host, err := primary.Container.ContainerIP(ctx)
	if err != nil {
		return nil, fmt.Errorf("tenantdbtest: the primary's address on the Docker network: %w", err)
	}
	cfg := withOptions(postgresConfig{}, opts)
	settings := []string{"fsync=off", fmt.Sprintf("max_connections=%d", DefaultMaxConnections), "hot_standby=on"}
	settings = append(settings, cfg.settings...)
	var start strings.Builder
	fmt.Fprintf(&start, `[ -s "$PGDATA/PG_VERSION" ] || PGPASSWORD=%s pg_basebackup -h %s -p 5432 -U %s -D "$PGDATA" -R -X stream -c fast || exit 1; `+
		`exec docker-entrypoint.sh postgres`, shellQuote(primary.Password), shellQuote(host), shellQuote(primary.User))
	for _, s := range settings {
		fmt.Fprintf(&start, " -c %s", shellQuote(s))
	}
	opts = append(append([]PostgresOption{}, opts...),
		WithPostgresImage(primary.Image),
		WithCredentials(primary.User, primary.Password),
		WithDatabase(primary.Database),
		func(c *postgresConfig) {
			c.cmd, c.standby, c.initScripts = []string{"bash", "-c", start.String()}, true, nil
		})
	return runPostgres(ctx, opts)
}

// withCmd replaces the container's command, unless cmd is nil.
func withCmd(cmd []string) testcontainers.CustomizeRequestOption {
	return func(req *testcontainers.GenericContainerRequest) error {
		if cmd != nil {
			req.Cmd = cmd
		}
		return nil
	}
}

// shellQuote quotes s for bash.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
