package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// runPgBouncer is the peer users would pick instead of tenantdb: PgBouncer in
// front of the same server, each tenant a database user with its own pool
// capped by max_user_connections, the database capped by max_db_connections.
// Each tenant's application pool may open as many client connections as it
// has requests; PgBouncer queues them. pgxpool talks to it with the simple
// protocol, as transaction pooling in PgBouncer 1.18 requires.
func runPgBouncer(ctx context.Context, env *environment, name string) ([]result, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin, err = exec.LookPath("/usr/sbin/pgbouncer")
	}
	if err != nil {
		return nil, skipError{"pgbouncer is not installed (Debian: apt-get install pgbouncer)"}
	}
	server, err := url.Parse(env.pg.DSN)
	if err != nil {
		return nil, err
	}
	const password = "tenant-password"
	admin, err := pgx.Connect(ctx, env.pg.DSN)
	if err != nil {
		return nil, err
	}
	for _, tenant := range []string{"noisy", "quiet"} {
		// A role per tenant, as PgBouncer's per-user caps need.
		_, err := admin.Exec(ctx, fmt.Sprintf(`do $$ begin
			if not exists (select from pg_roles where rolname = '%[1]s') then
				create role %[1]s login password '%[2]s';
			end if; end $$`, tenant, password))
		if err != nil {
			admin.Close(ctx)
			return nil, fmt.Errorf("create role %s: %w", tenant, err)
		}
	}
	admin.Close(ctx)

	bouncer, err := startPgBouncer(ctx, bin, server, password, env.work)
	if err != nil {
		return nil, err
	}
	defer bouncer.stop()

	pools := map[string]*pgxpool.Pool{}
	for tenant, conns := range map[string]int{"noisy": env.work.noisyN, "quiet": env.work.quietN} {
		dsn := fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", tenant, password, bouncer.addr, db(server))
		cfg, err := env.pgxConfig(dsn, int32(conns))
		if err != nil {
			return nil, err
		}
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		defer p.Close()
		if err := warm(ctx, p, env.work); err != nil {
			return nil, err
		}
		pools[tenant] = p
	}
	if err := bouncer.waitServerConns(ctx, password, db(server)); err != nil {
		return nil, err
	}

	rows := env.measure(ctx, name, func(ctx context.Context, tenant string, d time.Duration) error {
		_, err := pools[tenant].Exec(ctx, sleepSQL(tenant, d))
		return err
	})
	hop, err := hopCost(ctx, env.pg.DSN, pools["quiet"])
	if err != nil {
		return nil, err
	}
	progress("%s: one select 1 costs %.3f ms direct and %.3f ms through PgBouncer (median of %d)",
		name, ms(hop.direct), ms(hop.bounced), hop.n)
	rows = append(rows, result{Scenario: name, Tenant: "select-1-direct", P50: ms(hop.direct), Completed: hop.n},
		result{Scenario: name, Tenant: "select-1-pgbouncer", P50: ms(hop.bounced), Completed: hop.n})
	return rows, nil
}

type hop struct {
	direct, bounced time.Duration
	n               int
}

// hopCost measures the extra hop: the median of sequential select 1 direct
// and through PgBouncer, alternating so that both see the same machine.
func hopCost(ctx context.Context, dsn string, bounced *pgxpool.Pool) (hop, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return hop{}, err
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.MaxConns = 1
	direct, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return hop{}, err
	}
	defer direct.Close()
	const n = 500
	var ds, bs []time.Duration
	for range n {
		for _, p := range []*pgxpool.Pool{direct, bounced} {
			t0 := time.Now()
			if _, err := p.Exec(ctx, "select 1"); err != nil {
				return hop{}, err
			}
			if p == direct {
				ds = append(ds, time.Since(t0))
			} else {
				bs = append(bs, time.Since(t0))
			}
		}
	}
	return hop{direct: percentile(ds, 50), bounced: percentile(bs, 50), n: n}, nil
}

type pgBouncer struct {
	addr string
	cmd  *exec.Cmd
	dir  string
}

func startPgBouncer(ctx context.Context, bin string, server *url.URL, password string, w workload) (*pgBouncer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "noisy-pgbouncer-")
	if err != nil {
		return nil, err
	}
	os.Chmod(dir, 0o755)
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%s dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = plain
auth_file = %s
admin_users = quiet
pool_mode = transaction
max_client_conn = %d
default_pool_size = %d
min_pool_size = %d
max_user_connections = %d
max_db_connections = %d
server_login_retry = 1
`, db(server), server.Hostname(), server.Port(), db(server), port, filepath.Join(dir, "users.txt"),
		w.noisyN+w.quietN+50, perTenantCap, perTenantCap, perTenantCap, sharedConns)
	users := fmt.Sprintf("\"noisy\" \"%s\"\n\"quiet\" \"%s\"\n", password, password)
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(users), 0o644); err != nil {
		return nil, err
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root; drop to an unprivileged user.
		runAs := "postgres"
		if _, err := user.Lookup(runAs); err != nil {
			runAs = "nobody"
		}
		args = append([]string{"-u", runAs}, args...)
		os.Chmod(dir, 0o777) // for its log file
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	logf, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()                  // the child keeps its own descriptor
	cmd.Stdout, cmd.Stderr = logf, logf // shown only if it fails to start
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b := &pgBouncer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, dir: dir}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", b.addr)
		if err == nil {
			c.Close()
			return b, nil
		}
		if time.Now().After(deadline) {
			b.stop()
			log, _ := os.ReadFile(filepath.Join(dir, "stderr.log"))
			return nil, fmt.Errorf("pgbouncer did not listen on %s: %v\n%s", b.addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitServerConns waits until PgBouncer has opened min_pool_size server
// connections for each tenant, so that connecting is not mistaken for
// queueing. It asks PgBouncer's admin console (SHOW POOLS).
func (b *pgBouncer) waitServerConns(ctx context.Context, password, database string) error {
	cfg, err := pgx.ParseConfig(fmt.Sprintf("postgres://quiet:%s@%s/pgbouncer?sslmode=disable", password, b.addr))
	if err != nil {
		return err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pgbouncer admin console: %w", err)
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		rows, err := conn.Query(ctx, "SHOW POOLS")
		if err != nil {
			return err
		}
		ready := 0
		for rows.Next() {
			row, err := rows.Values()
			if err != nil {
				return err
			}
			cols := map[string]any{}
			for i, fd := range rows.FieldDescriptions() {
				cols[fd.Name] = row[i]
			}
			if cols["database"] != database {
				continue
			}
			if n, _ := strconv.Atoi(fmt.Sprint(cols["sv_idle"])); n >= perTenantCap {
				ready++
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if ready == 2 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgbouncer opened no %d server connections per tenant in 30s", perTenantCap)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func db(server *url.URL) string { return strings.TrimPrefix(server.Path, "/") }

func (b *pgBouncer) stop() {
	b.cmd.Process.Signal(os.Interrupt)
	b.cmd.Wait()
	os.RemoveAll(b.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
