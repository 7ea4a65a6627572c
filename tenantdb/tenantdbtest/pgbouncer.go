package tenantdbtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ErrNoPgBouncer is returned by RunPgBouncer when no pgbouncer binary is
// installed on this machine (StartPgBouncer skips the test instead).
var ErrNoPgBouncer = errors.New("tenantdbtest: pgbouncer is not installed (Debian: apt-get install pgbouncer)")

// Pool modes for WithPoolMode, as PgBouncer names them.
const (
	// PoolModeSession gives a client one server connection until it
	// disconnects, and runs server_reset_query (DISCARD ALL) before the
	// next client gets it. PgBouncer's default.
	PoolModeSession = "session"
	// PoolModeTransaction gives a client a server connection for one
	// transaction only: consecutive transactions of one client may run on
	// different server connections, and session state is not reset between
	// clients.
	PoolModeTransaction = "transaction"
)

// PgBouncer is a PgBouncer process on this machine in front of a Postgres,
// started by StartPgBouncer or RunPgBouncer. It runs on the host rather than
// in a container: Debian's package is what CI installs, and no registry is
// needed for it.
type PgBouncer struct {
	// DSN connects through PgBouncer as the Postgres's own user, to its
	// database: postgres://user:password@127.0.0.1:port/database?sslmode=disable.
	DSN string
	// AdminDSN connects to PgBouncer's admin console (database
	// "pgbouncer", SHOW POOLS and the like) as the Postgres's own user.
	// The console speaks the simple protocol only.
	AdminDSN string
	// Addr is PgBouncer's host:port on loopback.
	Addr string
	// Version is the version pgbouncer --version reports, such as "1.18.0"
	// (Debian bookworm's).
	Version string

	database string
	cmd      *exec.Cmd
	exited   chan struct{}
	dir      string
	stopOnce sync.Once
	stopErr  error
}

type pgBouncerConfig struct {
	poolMode       string
	poolSize       int
	users          map[string]string
	anyDatabase    bool
	settings       [][2]string
	startupTimeout time.Duration
}

// PgBouncerOption configures StartPgBouncer and RunPgBouncer.
type PgBouncerOption func(*pgBouncerConfig)

// WithPoolMode sets pool_mode: PoolModeSession (the default, as PgBouncer's)
// or PoolModeTransaction.
func WithPoolMode(mode string) PgBouncerOption {
	return func(c *pgBouncerConfig) { c.poolMode = mode }
}

// WithPoolSize sets default_pool_size: how many server connections PgBouncer
// opens per user and database. The default is PgBouncer's, 20.
func WithPoolSize(n int) PgBouncerOption {
	return func(c *pgBouncerConfig) { c.poolSize = n }
}

// WithPgBouncerUser lets user log in through PgBouncer with password, which
// must also be the user's password on the server. The Postgres's own user
// is always allowed.
func WithPgBouncerUser(name, password string) PgBouncerOption {
	return func(c *pgBouncerConfig) { c.users[name] = password }
}

// WithPgBouncerAnyDatabase adds a "*" entry to [databases], so that
// PgBouncer serves every database of the server by its own name (as for a
// database per tenant), not only the Postgres's own.
func WithPgBouncerAnyDatabase() PgBouncerOption {
	return func(c *pgBouncerConfig) { c.anyDatabase = true }
}

// WithPgBouncerSetting adds "name = value" to the [pgbouncer] section, after
// the ones the helper writes (a later one wins): max_client_conn,
// max_user_connections, min_pool_size, admin_users and the like.
func WithPgBouncerSetting(name, value string) PgBouncerOption {
	return func(c *pgBouncerConfig) { c.settings = append(c.settings, [2]string{name, value}) }
}

// StartPgBouncer runs PgBouncer in front of pg for t and stops it when t
// ends. It skips t when the pgbouncer binary is not installed, and fails it
// when PgBouncer cannot be started.
func StartPgBouncer(t testing.TB, pg *Postgres, opts ...PgBouncerOption) *PgBouncer {
	t.Helper()
	b, err := RunPgBouncer(context.Background(), pg, opts...)
	if errors.Is(err, ErrNoPgBouncer) {
		t.Skipf("%v", err)
	}
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := b.Terminate(); err != nil {
			t.Errorf("%v", err)
		}
	})
	t.Logf("tenantdbtest: PgBouncer %s at %s in front of %s", b.Version, b.Addr, pg.Addr)
	return b
}

// RunPgBouncer is StartPgBouncer for programs outside tests: ctx governs
// the start only (the process outlives it). A Postgres with only its DSN
// set (a URL) will do. The caller must call Terminate
// when done; on error no process is left running. It returns ErrNoPgBouncer
// when the binary is not installed.
func RunPgBouncer(ctx context.Context, pg *Postgres, opts ...PgBouncerOption) (*PgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			return nil, ErrNoPgBouncer
		}
	}
	cfg := withOptions(pgBouncerConfig{poolMode: PoolModeSession, users: map[string]string{}, startupTimeout: 10 * time.Second}, opts)
	if cfg.poolMode != PoolModeSession && cfg.poolMode != PoolModeTransaction {
		return nil, fmt.Errorf("tenantdbtest: pool mode %q: want %q or %q", cfg.poolMode, PoolModeSession, PoolModeTransaction)
	}
	if pg.Addr == "" {
		pg = existingPostgres(pg.DSN) // a Postgres made of a DSN only
	}
	if pg.Addr == "" || pg.User == "" || pg.Database == "" {
		return nil, fmt.Errorf("tenantdbtest: PgBouncer needs the server's address, user and database; the Postgres's DSN is not a URL that names them")
	}
	cfg.users[pg.User] = pg.Password
	version, err := pgBouncerVersion(ctx, bin)
	if err != nil {
		return nil, err
	}
	// A port picked as free may be taken before PgBouncer binds it; try
	// again on another.
	for attempt := 1; ; attempt++ {
		b, err := startPgBouncer(ctx, bin, pg, cfg)
		if err == nil {
			b.Version = version
			return b, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == hostPortAttempts {
			return nil, err
		}
	}
}

var errPortTaken = errors.New("address already in use")

var pgBouncerVersionRE = regexp.MustCompile(`(?m)^PgBouncer (\S+)`)

func pgBouncerVersion(ctx context.Context, bin string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("tenantdbtest: %s --version: %w: %s", bin, err, out)
	}
	m := pgBouncerVersionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("tenantdbtest: %s --version printed no version: %s", bin, out)
	}
	return string(m[1]), nil
}

func startPgBouncer(ctx context.Context, bin string, pg *Postgres, cfg pgBouncerConfig) (*PgBouncer, error) {
	host, port, err := net.SplitHostPort(pg.Addr)
	if err != nil {
		return nil, fmt.Errorf("tenantdbtest: server address %q: %w", pg.Addr, err)
	}
	if host == "localhost" {
		host = "127.0.0.1" // PgBouncer might try ::1 first
	}
	listen, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tenantdbtest-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("tenantdbtest: %w", err)
	}
	fail := func(err error) (*PgBouncer, error) {
		os.RemoveAll(dir)
		return nil, err
	}

	var ini strings.Builder
	fmt.Fprintf(&ini, "[databases]\n%s = host=%s port=%s dbname=%s\n", pg.Database, host, port, pg.Database)
	if cfg.anyDatabase {
		fmt.Fprintf(&ini, "* = host=%s port=%s\n", host, port)
	}
	ini.WriteString("\n")
	fmt.Fprintf(&ini, "[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = %d\nunix_socket_dir =\n", listen)
	// The auth file holds clear-text passwords, so PgBouncer can answer
	// the server's SCRAM challenge and check the client's.
	fmt.Fprintf(&ini, "auth_type = scram-sha-256\nauth_file = %s\n", filepath.Join(dir, "users.txt"))
	fmt.Fprintf(&ini, "admin_users = %s\npool_mode = %s\nserver_login_retry = 1\n", pg.User, cfg.poolMode)
	fmt.Fprintf(&ini, "logfile = %s\n", filepath.Join(dir, "pgbouncer.log"))
	if cfg.poolSize > 0 {
		fmt.Fprintf(&ini, "default_pool_size = %d\n", cfg.poolSize)
	}
	for _, s := range cfg.settings {
		fmt.Fprintf(&ini, "%s = %s\n", s[0], s[1])
	}
	names := make([]string, 0, len(cfg.users))
	for name := range cfg.users {
		names = append(names, name)
	}
	sort.Strings(names)
	var users strings.Builder
	for _, name := range names {
		fmt.Fprintf(&users, "%q %q\n", name, cfg.users[name])
	}
	iniPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(iniPath, []byte(ini.String()), 0o644); err != nil {
		return fail(fmt.Errorf("tenantdbtest: %w", err))
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(users.String()), 0o644); err != nil {
		return fail(fmt.Errorf("tenantdbtest: %w", err))
	}
	args := []string{iniPath}
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root; it drops to another user,
		// which must be able to write its log into dir.
		runAs := "postgres"
		if _, err := user.Lookup(runAs); err != nil {
			runAs = "nobody"
		}
		args = append([]string{"-u", runAs}, args...)
		if err := os.Chmod(dir, 0o777); err != nil {
			return fail(fmt.Errorf("tenantdbtest: %w", err))
		}
	}
	// Not CommandContext: ctx governs the start, not the process's life.
	cmd := exec.Command(bin, args...)
	stderr, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return fail(fmt.Errorf("tenantdbtest: %w", err))
	}
	defer stderr.Close() // the child has its own descriptor
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("tenantdbtest: start %s: %w", bin, err))
	}
	b := &PgBouncer{
		Addr:     net.JoinHostPort("127.0.0.1", strconv.Itoa(listen)),
		database: pg.Database,
		cmd:      cmd,
		exited:   make(chan struct{}),
		dir:      dir,
	}
	go func() { _ = cmd.Wait(); close(b.exited) }()
	b.DSN = b.DSNFor(pg.User, pg.Password)
	b.AdminDSN = b.dsn(pg.User, pg.Password, "pgbouncer")

	ctx, cancel := context.WithTimeout(ctx, cfg.startupTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", b.Addr)
		if err == nil {
			c.Close()
			return b, nil
		}
		select {
		case <-b.exited:
			log := b.Log()
			b.Terminate()
			if strings.Contains(log, "Address already in use") {
				return nil, errPortTaken
			}
			return nil, fmt.Errorf("tenantdbtest: pgbouncer exited at start (%v):\n%s", cmd.ProcessState, log)
		case <-ctx.Done():
			log := b.Log()
			b.Terminate()
			return nil, fmt.Errorf("tenantdbtest: pgbouncer did not listen on %s: %w\n%s", b.Addr, ctx.Err(), log)
		case <-tick.C:
		}
	}
}

// DSNFor connects through PgBouncer as user (allowed by WithPgBouncerUser)
// to the Postgres's database.
func (b *PgBouncer) DSNFor(user, password string) string {
	return b.dsn(user, password, b.database)
}

func (b *PgBouncer) dsn(user, password, database string) string {
	return (&url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(user, password),
		Host:     b.Addr,
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}).String()
}

// Log returns what PgBouncer has logged so far, for a failing test's message.
func (b *PgBouncer) Log() string {
	var s strings.Builder
	for _, f := range []string{"stderr.log", "pgbouncer.log"} {
		if data, err := os.ReadFile(filepath.Join(b.dir, f)); err == nil {
			s.Write(data)
		}
	}
	return s.String()
}

// Terminate stops PgBouncer at once (SIGTERM: open client connections are
// closed) and removes its files. Only the first call does anything.
func (b *PgBouncer) Terminate() error {
	if b == nil {
		return nil
	}
	b.stopOnce.Do(func() {
		defer os.RemoveAll(b.dir)
		select {
		case <-b.exited:
			return
		default:
		}
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.exited:
		case <-time.After(10 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.exited
			b.stopErr = fmt.Errorf("tenantdbtest: pgbouncer ignored SIGTERM for 10s and was killed")
		}
	})
	return b.stopErr
}

// freeLoopbackPort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("tenantdbtest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
