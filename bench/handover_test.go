package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// The hand-over workload of issue 30: handoverWorkers workers share
// handoverConns connections, each query `select $1::int` for a tenant taken
// round-robin from one or handoverTenants tenants (a plan cap of
// handoverConns, so that no tenant waits for its cap). With 1,000 tenants
// almost every acquire changes the connection's tenant.
const (
	handoverConns   = 8
	handoverWorkers = 8
	handoverTenants = 1000
	handoverQueries = 8000 // per variant and round
	handoverRounds  = 5
)

// BenchmarkTenantHandover measures the time per query of raw pgxpool and of
// tenantdb without Session, with ScopeSession and with ScopeTransaction, on
// one tenant and on 1,000, in rounds that run every variant in turn
// (rotated each round), and reports each variant's median over the rounds
// and its ratio to pgxpool's median. ScopeTransaction needs
// QueryExecModeExec, so pgxpool in that mode is measured too; pgxpool with
// one more statement in each round trip is the floor of any reset that the
// server runs, and pgxpool in exec mode with the tenant setting in front of
// each query the floor of ScopeTransaction (with the role and search_path
// pins too, its floor on one tenant); the same with DISCARD ALL in front
// are their floors on a change of tenant. The reset at release alone gives
// the floor metric, (pgxpool + the reset) / pgxpool.
func BenchmarkTenantHandover(b *testing.B) {
	ctx := context.Background()
	type variant struct {
		name string
		base string // the pgxpool variant it is compared with
		run  func(i int64) error
	}
	var variants []variant
	// One pgxpool per mode serves pgxpool and its floors, which leave
	// nothing in a session (DISCARD ALL empties it, set_config(..., true)
	// ends with the transaction): a pool each would take more connections
	// than PostgreSQL's default max_connections of 100.
	raws := map[pgx.QueryExecMode]*pgxpool.Pool{}
	rawPool := func(mode pgx.QueryExecMode) *pgxpool.Pool {
		if raw, ok := raws[mode]; ok {
			return raw
		}
		cfg := handoverConfig(b, mode)
		raw, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(raw.Close)
		raws[mode] = raw
		return raw
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		raw := rawPool(mode)
		variants = append(variants, variant{"pgxpool" + modeName(mode), "", func(i int64) error {
			var n int
			return raw.QueryRow(ctx, "select $1::int", i%1000).Scan(&n)
		}})
	}
	// Floors: pgxpool sending what the server would have to run anyway in
	// front of each query, in the same round trip, with none of tenantdb's
	// work on the client.
	floor := func(name, base string, mode pgx.QueryExecMode, statements ...string) variant {
		raw := rawPool(mode)
		return variant{name, base, func(i int64) error {
			return queryAfter(ctx, raw, statements, i%1000)
		}}
	}
	const setting = "select pg_catalog.set_config('app.tenant_id', 't1', true)"
	variants = append(variants,
		// One more statement, the cheapest there is: the floor of any
		// reset that the server runs.
		floor("pgxpool + one statement", "pgxpool", pgx.QueryExecModeCacheStatement, "select 1"),
		// DISCARD ALL, and the query parsed again (exec mode): the floor
		// of a change of tenant that keeps no statement of the previous
		// holder's session.
		floor("pgxpool + DISCARD ALL, parsed again", "pgxpool", pgx.QueryExecModeExec, "discard all"),
		// ScopeSession's on a change of tenant: the same with the SET of
		// the tenant's value after the reset.
		floor("pgxpool + DISCARD ALL + SET, parsed again", "pgxpool", pgx.QueryExecModeExec, "discard all", sessionSet),
		// ScopeTransaction's: the tenant setting alone, set_config(...,
		// true), in front of each query, on one tenant and with a change
		// of tenant.
		floor("pgxpool (exec) + the setting", "pgxpool (exec)", pgx.QueryExecModeExec, setting),
		floor("pgxpool (exec) + DISCARD ALL + the setting", "pgxpool (exec)", pgx.QueryExecModeExec, "discard all", setting),
		// ScopeTransaction's on one tenant: the setting with issue 25's
		// role and search_path pins, which every transaction on a session
		// the tenant's own SQL may have changed carries.
		floor("pgxpool (exec) + the setting and pins", "pgxpool (exec)", pgx.QueryExecModeExec, pinnedSetting),
	)
	// The reset at release alone, in a round trip of its own on a session
	// in the state pgxpool's variant leaves: what each change of tenant
	// adds to the server's and the client's work wherever it runs. On two
	// cores, where client and server share the CPU, pgxpool plus this is
	// the floor of a change of tenant per query that no client-side change
	// can beat (see the floor metric below).
	resetRaw := rawPool(pgx.QueryExecModeCacheStatement)
	resetSQL := strings.Join(resetParts, "; ")
	variants = append(variants, variant{resetAlone, "pgxpool", func(int64) error {
		c, err := resetRaw.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		_, err = c.Conn().PgConn().Exec(ctx, resetSQL).ReadAll()
		return err
	}})
	sessions := []struct {
		name    string
		session tenantdb.Session
	}{
		{"tenantdb", tenantdb.Session{}},
		{"ScopeSession", tenantdb.Session{TenantSetting: "app.tenant_id"}},
		{"ScopeTransaction", tenantdb.Session{TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction}},
	}
	for _, s := range sessions {
		mode := pgx.QueryExecModeCacheStatement
		if s.session.Scope == tenantdb.ScopeTransaction {
			mode = pgx.QueryExecModeExec
		}
		for _, tenants := range []int64{1, handoverTenants} {
			p, err := tenantdb.New(ctx, handoverConfig(b, mode), tenantdb.Config{
				Plans:   map[string]tenantdb.Plan{"std": {MaxConns: handoverConns}},
				Session: s.session,
				Logger:  slog.New(slog.DiscardHandler),
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(p.Close)
			ids := make([]context.Context, tenants)
			for t := range ids {
				ids[t] = tenantdb.WithTenant(ctx, fmt.Sprintf("t%d", t))
			}
			name := fmt.Sprintf("%s, %d tenant", s.name, tenants)
			if tenants > 1 {
				name += "s"
			}
			variants = append(variants, variant{name, "pgxpool" + modeName(mode), func(i int64) error {
				var n int
				return p.QueryRow(ids[i%tenants], "select $1::int", i%1000).Scan(&n)
			}})
		}
	}
	for b.Loop() {
		for _, v := range variants { // warm: connect, prepare
			if _, err := runHandover(v.run, handoverConns*100); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
		}
		perQuery := make([][]time.Duration, len(variants))
		for round := range handoverRounds {
			for k := range variants {
				i := (k + round) % len(variants)
				d, err := runHandover(variants[i].run, handoverQueries)
				if err != nil {
					b.Fatalf("%s: %v", variants[i].name, err)
				}
				perQuery[i] = append(perQuery[i], d/handoverQueries)
			}
		}
		medians := map[string]time.Duration{}
		for i, v := range variants {
			medians[v.name] = median(perQuery[i])
		}
		var table strings.Builder
		fmt.Fprintf(&table, "\n| setup | µs per query (median of %d rounds) | rounds | vs pgxpool |\n|---|---:|---|---:|\n", handoverRounds)
		for i, v := range variants {
			base := v.base
			if base == "" {
				base = v.name
			}
			ratio := float64(medians[v.name]) / float64(medians[base])
			rounds := make([]string, len(perQuery[i]))
			for r, d := range perQuery[i] {
				rounds[r] = fmt.Sprintf("%.0f", float64(d.Nanoseconds())/1e3)
			}
			fmt.Fprintf(&table, "| %s | %.0f | %s | %.2fx %s |\n", v.name, float64(medians[v.name].Nanoseconds())/1e3,
				strings.Join(rounds, " "), ratio, base)
			b.ReportMetric(ratio, strings.NewReplacer(" ", "", ",", "-").Replace(v.name)+"-x")
		}
		// The floor of a change of tenant per query: pgxpool's query and
		// the reset, each at its own measured cost.
		floor := float64(medians["pgxpool"]+medians[resetAlone]) / float64(medians["pgxpool"])
		fmt.Fprintf(&table, "\nfloor of a change of tenant per query, (pgxpool + %s) / pgxpool: %.2fx; tenantdb, %d tenants: %.2fx of it\n",
			resetAlone, floor, handoverTenants, float64(medians[fmt.Sprintf("tenantdb, %d tenants", handoverTenants)])/float64(medians["pgxpool"])/floor)
		b.ReportMetric(floor, "floor-x")
		fmt.Println(table.String()) // b.Log would keep only the first lines without -v
	}
	b.ReportMetric(0, "ns/op")
}

// resetAlone names the variant of BenchmarkTenantHandover that runs
// tenantdb's reset at release alone.
const resetAlone = "the reset alone"

// sessionSet is the statement ScopeSession sends after the reset of a
// change of tenant, for tenant t1.
const sessionSet = `set "app"."tenant_id" to E't1'`

// pinnedSetting is the statement ScopeTransaction sends in a transaction
// on a session that may have changed, for tenant t1 and the benchmark
// role's default search_path: the setting, the role and the search_path.
const pinnedSetting = `select pg_catalog.set_config('role', E'none', true), pg_catalog.set_config('app.tenant_id', E't1', true), ` +
	`pg_catalog.set_config('search_path', E'"$user", public, pg_temp', true)`

// queryAfter runs the hand-over query on p with statements in front of it,
// in one batch: one round trip.
func queryAfter(ctx context.Context, p *pgxpool.Pool, statements []string, i int64) error {
	b := &pgx.Batch{}
	for _, sql := range statements {
		b.Queue(sql)
	}
	b.Queue("select $1::int", i)
	return p.SendBatch(ctx, b).Close()
}

// modeName names the exec modes other than pgx's default.
func modeName(mode pgx.QueryExecMode) string {
	if mode == pgx.QueryExecModeCacheStatement {
		return ""
	}
	return " (" + mode.String() + ")"
}

// handoverConfig is a pgxpool.Config of handoverConns connections, all open,
// in mode.
func handoverConfig(b *testing.B, mode pgx.QueryExecMode) *pgxpool.Config {
	cfg := pgxConfig(b)
	cfg.MaxConns, cfg.MinConns = handoverConns, handoverConns
	cfg.ConnConfig.DefaultQueryExecMode = mode
	return cfg
}

// runHandover runs n queries on handoverWorkers workers, each query numbered
// from one counter (run picks the tenant from it), and returns the time per
// query times n, the wall time.
func runHandover(run func(i int64) error, n int64) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var first error
	var once sync.Once
	start := time.Now()
	for range workers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < n; i = next.Add(1) - 1 {
				if err := run(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), first
}

// workers is handoverWorkers, or TENANTDB_HANDOVER_WORKERS: 4 measures a
// pool with idle connections, where the reset at release is off every
// caller's path; 8 (the default) a saturated one.
func workers() int {
	if n, err := strconv.Atoi(os.Getenv("TENANTDB_HANDOVER_WORKERS")); err == nil && n > 0 {
		return n
	}
	return handoverWorkers
}

// median of ds (sorted in place).
func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}
