package tenantdbtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"
)

const (
	postgresDSNEnv = "TENANTDB_POSTGRES_DSN"
	postgresPort   = "5432/tcp"

	// DefaultMaxConnections is the max_connections the helpers give
	// PostgreSQL unless WithMaxConnections says otherwise. PostgreSQL's own
	// default, 100, is too few for tests that open several pools of a few
	// dozen connections each.
	DefaultMaxConnections = 300
)

// postgresService is how StartPostgres and RunPostgres get a PostgreSQL server.
var postgresService = service[*Postgres, PostgresOption]{
	envVar:   postgresDSNEnv,
	existing: func(dsn string) (*Postgres, error) { return existingPostgres(dsn), nil },
	run:      runPostgres,
	describe: func(p *Postgres) string { return fmt.Sprintf("PostgreSQL (%s) at %s", p.Image, p.Addr) },
}

// Postgres is a PostgreSQL server for tests: a container started by
// StartPostgres or RunPostgres, or an existing server named by
// TENANTDB_POSTGRES_DSN.
type Postgres struct {
	// DSN connects to the server, for pgxpool.ParseConfig or pgx.Connect:
	// postgres://user:password@127.0.0.1:port/database?sslmode=disable.
	// The host port is fixed when the container is created, so the DSN
	// stays valid across Stop and Start.
	DSN string
	// Addr is the server's host:port, User, Password and Database the
	// credentials in DSN: for tools configured by parts, like pgbouncer.
	// For an existing server they are filled only when its DSN is a URL.
	Addr     string
	User     string
	Password string
	Database string
	// Image is the image the container runs; empty for an existing server.
	Image string
	// Container is the running container, for anything the methods below
	// do not cover; nil for an existing server.
	Container *tcpostgres.PostgresContainer

	server // Stop, Start, Restart, Pause, Unpause
}

type postgresConfig struct {
	image          string
	user           string
	password       string
	database       string
	settings       []string // "name=value", each passed as "postgres -c name=value"
	initScripts    []string
	startupTimeout time.Duration
	cpuset         string
	cmd            []string // replaces "postgres -c ..." (StartReplica's)
	standby        bool     // the server is a hot standby: it logs "ready to accept read-only connections"
}

// PostgresOption configures StartPostgres and RunPostgres.
type PostgresOption func(*postgresConfig)

// WithPostgresImage runs image instead of the one chosen from
// TENANTDB_POSTGRES_IMAGE or the defaults. It must honour the official
// postgres image's contract (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB,
// /docker-entrypoint-initdb.d, a "postgres -c ..." command) and contain
// pg_isready.
func WithPostgresImage(image string) PostgresOption {
	return func(c *postgresConfig) { c.image = image }
}

// WithCredentials sets the superuser the container is created with. The
// default is user "tenantdb" with password "tenantdb".
func WithCredentials(user, password string) PostgresOption {
	return func(c *postgresConfig) { c.user, c.password = user, password }
}

// WithDatabase sets the database the container creates and DSN names. The
// default is "tenantdb".
func WithDatabase(name string) PostgresOption {
	return func(c *postgresConfig) { c.database = name }
}

// WithSetting passes "-c name=value" to the server. Settings apply in the
// order given, after the defaults (fsync=off and max_connections), so a
// later one wins.
func WithSetting(name, value string) PostgresOption {
	return func(c *postgresConfig) { c.settings = append(c.settings, name+"="+value) }
}

// WithMaxConnections sets max_connections; the default is
// DefaultMaxConnections.
func WithMaxConnections(n int) PostgresOption {
	return WithSetting("max_connections", strconv.Itoa(n))
}

// WithInitScripts runs the given files (*.sql, *.sql.gz, *.sh) in the order
// given when the container first starts, against the database of
// WithDatabase; keep them in a testdata directory.
func WithInitScripts(paths ...string) PostgresOption {
	return func(c *postgresConfig) { c.initScripts = append(c.initScripts, paths...) }
}

// WithCPUSet confines the server to the host CPUs listed, in the form of
// docker run --cpuset-cpus ("1", "0-1", "0,2"): for tests of CPU-bound load,
// where the database must saturate while the client keeps a core of its
// own. A set rather than a CPU quota, because a quota throttles the whole
// server in 100 ms periods, which shows up as latency spikes of its own.
// Default: all CPUs.
func WithCPUSet(cpus string) PostgresOption {
	return func(c *postgresConfig) { c.cpuset = cpus }
}

// WithPostgresStartupTimeout bounds how long starting (and each Start after
// Stop) waits for the server to accept connections; the default is two
// minutes.
func WithPostgresStartupTimeout(d time.Duration) PostgresOption {
	return func(c *postgresConfig) { c.startupTimeout = d }
}

// StartPostgres returns a PostgreSQL server for t, started in a container
// that is terminated when t ends, or the server TENANTDB_POSTGRES_DSN names
// (the options do not apply to it). It fails t when neither can be had,
// never skips it.
func StartPostgres(t testing.TB, opts ...PostgresOption) *Postgres {
	t.Helper()
	return postgresService.start(t, opts)
}

// RunPostgres is StartPostgres for programs outside tests: ctx governs
// starting the container only. The caller must call Terminate when done;
// on error no container is left running.
func RunPostgres(ctx context.Context, opts ...PostgresOption) (*Postgres, error) {
	return postgresService.runForProgram(ctx, opts)
}

func existingPostgres(dsn string) *Postgres {
	p := &Postgres{DSN: dsn, server: newServer("PostgreSQL", postgresDSNEnv, testcontainers.Container(nil))}
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		p.Addr = u.Host
		p.User = u.User.Username()
		p.Password, _ = u.User.Password()
		p.Database = stripSlash(u.Path)
	}
	return p
}

func stripSlash(s string) string {
	if len(s) > 0 && s[0] == '/' {
		return s[1:]
	}
	return s
}

// runPostgres starts the container. On error it returns what it started,
// if anything, so that the caller can terminate it.
func runPostgres(ctx context.Context, opts []PostgresOption) (*Postgres, error) {
	cfg := withOptions(postgresConfig{
		user:           "tenantdb",
		password:       "tenantdb",
		database:       "tenantdb",
		settings:       []string{"max_connections=" + strconv.Itoa(DefaultMaxConnections)},
		startupTimeout: 2 * time.Minute,
	}, opts)
	for _, f := range cfg.initScripts {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("tenantdbtest: init script: %w", err)
		}
	}

	d, image, err := postgresImages.connect(ctx, "PostgreSQL", postgresDSNEnv, cfg.image)
	if err != nil {
		return nil, err
	}

	args := make([]string, 0, 2*len(cfg.settings))
	for _, s := range cfg.settings {
		args = append(args, "-c", s)
	}
	ctr, hostPort, err := runOnFreeHostPort(d, func(hostPort int) (*tcpostgres.PostgresContainer, error) {
		customizers := []testcontainers.ContainerCustomizer{
			tcpostgres.WithUsername(cfg.user),
			tcpostgres.WithPassword(cfg.password),
			tcpostgres.WithDatabase(cfg.database),
			// postgres.Run's command is "postgres -c fsync=off".
			testcontainers.WithCmdArgs(args...),
			withCmd(cfg.cmd),
			withHostPort(postgresPort, d.bindIP, hostPort),
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
				// Docker's default /dev/shm of 64 MB is tight for
				// PostgreSQL's dynamic shared memory with hundreds
				// of connections or parallel queries.
				hc.ShmSize = 256 << 20
				hc.CpusetCpus = cfg.cpuset
			}),
			testcontainers.WithConfigModifier(func(c *container.Config) {
				// Fast shutdown, as the official image's STOPSIGNAL:
				// the default SIGTERM asks for a smart shutdown, which
				// waits for every client to disconnect, so Stop would
				// take Docker's whole grace period whenever a pool is
				// open. (docker import cannot set STOPSIGNAL, so the
				// local image cannot carry it.)
				c.StopSignal = "SIGINT"
			}),
			testcontainers.WithWaitStrategyAndDeadline(cfg.startupTimeout, postgresWaitStrategies(cfg)...),
		}
		if len(cfg.initScripts) > 0 {
			customizers = append(customizers, tcpostgres.WithOrderedInitScripts(cfg.initScripts...))
		}
		return tcpostgres.Run(ctx, image, customizers...)
	})
	p := &Postgres{
		User:      cfg.user,
		Password:  cfg.password,
		Database:  cfg.database,
		Image:     image,
		Container: ctr,
		server:    newServer("PostgreSQL", postgresDSNEnv, ctr),
	}
	if err != nil {
		return p, postgresImages.startError("PostgreSQL", image, err)
	}
	// The binding asked for is what Docker published; read it back all
	// the same, so the DSN is right even on a runtime that ignored it.
	if mapped, err := mappedHostPort(ctx, ctr, postgresPort); err == nil {
		hostPort = mapped
	}
	p.Addr = net.JoinHostPort(d.host, strconv.Itoa(hostPort))
	p.DSN = (&url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(cfg.user, cfg.password),
		Host:     p.Addr,
		Path:     "/" + cfg.database,
		RawQuery: "sslmode=disable",
	}).String()
	return p, nil
}

// postgresWaitStrategies decide when the server is ready, on first start
// and on every Start after Stop (testcontainers applies them again then).
//
// The readiness log line alone cannot do: the official image logs it twice
// on first start (a temporary server runs the init scripts first), and after
// a restart the container's log still holds the earlier lines, so a count
// would be satisfied at once. It is waited for once, which holds for both
// images and catches an entrypoint that dies early; then the port must be
// listening inside the container (the temporary server listens on no TCP
// port), and pg_isready over TCP must see the server accept connections,
// which also covers the moment after a restart when the port is open but
// the server still answers "starting up".
func postgresWaitStrategies(cfg postgresConfig) []wait.Strategy {
	ready := "database system is ready to accept connections"
	if cfg.standby {
		ready = "database system is ready to accept read-only connections"
	}
	return []wait.Strategy{
		wait.ForLog(ready).WithStartupTimeout(cfg.startupTimeout),
		wait.ForListeningPort(postgresPort).WithStartupTimeout(cfg.startupTimeout),
		wait.ForExec([]string{
			"pg_isready", "--quiet", "--host=127.0.0.1", "--port=5432",
			"--username=" + cfg.user, "--dbname=" + cfg.database,
		}).WithStartupTimeout(cfg.startupTimeout),
	}
}

// Terminate stops and removes the container and its data; ctx governs the
// Docker requests. It does nothing for an existing server, and only the
// first call does anything. StartPostgres arranges it through t.Cleanup;
// after RunPostgres the caller must call it.
func (p *Postgres) Terminate(ctx context.Context) error { return terminate(ctx, p) }
