package bench

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// handoverCPUQueries is how many queries each variant of
// BenchmarkHandoverServerCPU runs: enough clock ticks (10 ms each) to count.
const handoverCPUQueries = 20000

// BenchmarkHandoverServerCPU measures what a change of tenant costs the
// server, which a loaded machine does not blur: the CPU time of the one
// server process behind a pool of one connection (utime+stime from its
// /proc/self/stat, read through pg_read_file) per `select $1::int`, for
// raw pgxpool, and for tenantdb with one tenant and with two tenants in
// turn (a change of tenant on every query).
func BenchmarkHandoverServerCPU(b *testing.B) {
	ctx := context.Background()
	type variant struct {
		name string
		pool *pgxpool.Pool // where the server process is read
		run  func(i int) error
	}
	oneConn := func(mode pgx.QueryExecMode) *pgxpool.Config {
		cfg := pgxConfig(b)
		cfg.MaxConns, cfg.MinConns = 1, 1
		cfg.ConnConfig.DefaultQueryExecMode = mode
		return cfg
	}
	var variants []variant
	raw, err := pgxpool.NewWithConfig(ctx, oneConn(pgx.QueryExecModeCacheStatement))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(raw.Close)
	variants = append(variants, variant{"pgxpool", raw, func(i int) error {
		var n int
		return raw.QueryRow(ctx, "select $1::int", i).Scan(&n)
	}})
	tenants := []context.Context{tenantdb.WithTenant(ctx, "a"), tenantdb.WithTenant(ctx, "b")}
	for _, s := range []struct {
		name    string
		session tenantdb.Session
	}{
		{"tenantdb", tenantdb.Session{}},
		{"ScopeSession", tenantdb.Session{TenantSetting: "app.tenant_id"}},
	} {
		for _, turns := range []int{1, 2} {
			p, err := tenantdb.New(ctx, oneConn(pgx.QueryExecModeCacheStatement), tenantdb.Config{
				Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 1}},
				Session: s.session,
				Logger:  slog.New(slog.DiscardHandler),
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(p.Close)
			name := s.name + ", same tenant"
			if turns == 2 {
				name = s.name + ", a change of tenant per query"
			}
			variants = append(variants, variant{name, p.Pgxpool(), func(i int) error {
				var n int
				return p.QueryRow(tenants[i%turns], "select $1::int", i).Scan(&n)
			}})
		}
	}
	for b.Loop() {
		var table strings.Builder
		fmt.Fprintf(&table, "\n| setup | server CPU per query | vs pgxpool |\n|---|---:|---:|\n")
		var base float64
		for _, v := range variants {
			for i := range 100 { // warm
				if err := v.run(i); err != nil {
					b.Fatalf("%s: %v", v.name, err)
				}
			}
			before := serverTicks(b, v.pool)
			for i := range handoverCPUQueries {
				if err := v.run(i); err != nil {
					b.Fatalf("%s: %v", v.name, err)
				}
			}
			us := float64(serverTicks(b, v.pool)-before) * 10000 / handoverCPUQueries
			if base == 0 {
				base = us
			}
			fmt.Fprintf(&table, "| %s | %.0f µs | %.2fx |\n", v.name, us, us/base)
		}
		fmt.Println(table.String())
	}
	b.ReportMetric(0, "ns/op")
}

// serverTicks is the CPU time, in clock ticks, of the server process behind
// p's one connection.
func serverTicks(b *testing.B, p *pgxpool.Pool) int {
	var stat string
	err := p.QueryRow(context.Background(), "select pg_read_file('/proc/self/stat')").Scan(&stat)
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(stat[strings.LastIndexByte(stat, ')')+2:])
	utime, err1 := strconv.Atoi(f[11])
	stime, err2 := strconv.Atoi(f[12])
	if err1 != nil || err2 != nil {
		b.Fatalf("unreadable /proc/self/stat: %q", stat)
	}
	return utime + stime
}
