package bench

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// The server under callgrind that BenchmarkHandoverServerInstructions
// measures (see bench/callgrind-postgres.sh, which prints both).
const (
	callgrindDSNEnv = "TENANTDB_CALLGRIND_DSN" // the server's DSN
	callgrindOutEnv = "TENANTDB_CALLGRIND_OUT" // the directory of its out.<pid> files
)

// BenchmarkHandoverServerInstructions counts the instructions the server
// runs per query, which neither the machine's load nor its speed changes:
// PostgreSQL runs under valgrind's callgrind, and each variant runs twice on
// a pool of one connection, for a few queries and for irQueries more; the
// difference of the two server processes' instruction totals, divided by
// irQueries, is the cost of one query. Skipped without a server under
// callgrind. It takes about half a minute.
func BenchmarkHandoverServerInstructions(b *testing.B) {
	dsn, out := callgrindServer(b)
	const irQueries, warm = 1000, 100
	ctx := context.Background()
	tenants := []context.Context{tenantdb.WithTenant(ctx, "a"), tenantdb.WithTenant(ctx, "b")}
	oneConn := func(mode pgx.QueryExecMode) *pgxpool.Config {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns, cfg.MinConns = 1, 1
		cfg.ConnConfig.DefaultQueryExecMode = mode
		return cfg
	}
	// A variant opens a pool of one connection and returns how to run
	// query i on it, and the pgxpool under it.
	type variant struct {
		name string
		open func() (run func(i int) error, pg *pgxpool.Pool, close func())
	}
	raw := func(mode pgx.QueryExecMode, statements ...string) func() (func(int) error, *pgxpool.Pool, func()) {
		return func() (func(int) error, *pgxpool.Pool, func()) {
			p, err := pgxpool.NewWithConfig(ctx, oneConn(mode))
			if err != nil {
				b.Fatal(err)
			}
			return func(i int) error {
				if len(statements) == 0 {
					var n int
					return p.QueryRow(ctx, "select $1::int", i).Scan(&n)
				}
				return queryAfter(ctx, p, statements, int64(i))
			}, p, p.Close
		}
	}
	pool := func(session tenantdb.Session, turns int) func() (func(int) error, *pgxpool.Pool, func()) {
		return func() (func(int) error, *pgxpool.Pool, func()) {
			mode := pgx.QueryExecModeCacheStatement
			if session.Scope == tenantdb.ScopeTransaction {
				mode = pgx.QueryExecModeExec
			}
			p, err := tenantdb.New(ctx, oneConn(mode), tenantdb.Config{
				Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 1}},
				Session: session,
				Logger:  slog.New(slog.DiscardHandler),
			})
			if err != nil {
				b.Fatal(err)
			}
			return func(i int) error {
				var n int
				return p.QueryRow(tenants[i%turns], "select $1::int", i).Scan(&n)
			}, p.Pgxpool(), p.Close
		}
	}
	const setting = "select pg_catalog.set_config('app.tenant_id', 't1', true)"
	sessionScope := tenantdb.Session{TenantSetting: "app.tenant_id"}
	txScope := tenantdb.Session{TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction}
	variants := []variant{
		{"pgxpool", raw(pgx.QueryExecModeCacheStatement)},
		{"pgxpool (exec)", raw(pgx.QueryExecModeExec)},
		{"pgxpool + one statement", raw(pgx.QueryExecModeCacheStatement, "select 1")},
		{"pgxpool + DISCARD ALL, parsed again", raw(pgx.QueryExecModeExec, "discard all")},
		{"pgxpool + DISCARD ALL + SET, parsed again", raw(pgx.QueryExecModeExec, "discard all", sessionSet)},
		{"pgxpool (exec) + the setting", raw(pgx.QueryExecModeExec, setting)},
		{"pgxpool (exec) + DISCARD ALL + the setting", raw(pgx.QueryExecModeExec, "discard all", setting)},
		{"pgxpool (exec) + the setting and pins", raw(pgx.QueryExecModeExec, pinnedSetting)},
		{"tenantdb, same tenant", pool(tenantdb.Session{}, 1)},
		{"tenantdb, a change of tenant per query", pool(tenantdb.Session{}, 2)},
		{"ScopeSession, same tenant", pool(sessionScope, 1)},
		{"ScopeSession, a change of tenant per query", pool(sessionScope, 2)},
		{"ScopeTransaction, same tenant", pool(txScope, 1)},
		{"ScopeTransaction, a change of tenant per query", pool(txScope, 2)},
	}
	// instructions runs n queries of v after the warm ones and returns the
	// server process's instruction total, read once it has exited.
	instructions := func(v variant, n int) int64 {
		run, pg, closePool := v.open()
		var pid int
		if err := pg.QueryRow(ctx, "select pg_catalog.pg_backend_pid()").Scan(&pid); err != nil {
			b.Fatal(err)
		}
		for i := range warm + n {
			if err := run(i); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
		}
		closePool()
		return callgrindTotal(b, filepath.Join(out, fmt.Sprintf("out.%d", pid)))
	}
	instructions(variants[0], 0) // the server's first connections cost more: not measured
	for b.Loop() {
		var table strings.Builder
		fmt.Fprintf(&table, "\n| setup | server instructions per query | vs pgxpool |\n|---|---:|---:|\n")
		var base float64
		for _, v := range variants {
			per := float64(instructions(v, irQueries)-instructions(v, 0)) / irQueries
			if base == 0 {
				base = per
			}
			fmt.Fprintf(&table, "| %s | %.0f | %.2fx |\n", v.name, per, per/base)
		}
		fmt.Println(table.String())
	}
	b.ReportMetric(0, "ns/op")
}

// callgrindTotal returns the instruction total that callgrind wrote to path
// when its process exited, waiting for the file to be complete.
func callgrindTotal(b *testing.B, path string) int64 {
	deadline := time.Now().Add(time.Minute)
	for {
		if total, ok := readCallgrindTotal(path); ok {
			return total
		}
		if time.Now().After(deadline) {
			b.Fatalf("no callgrind totals in %s after a minute: is the server under callgrind writing there?", path)
		}
		time.Sleep(50 * time.Millisecond) // polls for a file another process writes
	}
}

// readCallgrindTotal reads the "totals:" (or "summary:") line of a callgrind
// output file.
func readCallgrindTotal(path string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		if rest, ok := strings.CutPrefix(line, "totals:"); ok || strings.HasPrefix(line, "summary:") {
			if !ok {
				rest = strings.TrimPrefix(line, "summary:")
			}
			if fields := strings.Fields(rest); len(fields) > 0 {
				n, err := strconv.ParseInt(fields[0], 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}

// callgrindServer returns the DSN of the PostgreSQL that
// bench/callgrind-postgres.sh runs under callgrind and the directory of its
// output, and skips b without them.
func callgrindServer(b *testing.B) (dsn, out string) {
	b.Helper()
	dsn, out = os.Getenv(callgrindDSNEnv), os.Getenv(callgrindOutEnv)
	if dsn == "" || out == "" {
		b.Skipf("needs PostgreSQL under callgrind: %s and %s (bench/callgrind-postgres.sh)", callgrindDSNEnv, callgrindOutEnv)
	}
	return dsn, out
}
