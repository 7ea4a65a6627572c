package bench

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// BenchmarkScopeTransactionPins is the cost of pinning the role and the
// search_path in every transaction under ScopeTransaction, on one
// connection each, in pgx.QueryExecModeExec, one query "select $1::int"
// per variant in turn so that the machine's drift falls on all alike; the
// metrics are each variant's median time per query, which the spikes of a
// loaded machine move less than a mean:
//
//   - pgxpool: the query alone;
//   - setting: the query after set_config of the tenant setting in the same
//     batch, which ScopeTransaction sent before the pins;
//   - pinned: the same batch with the statement ScopeTransaction sends now
//     (role, setting, search_path with pg_temp last);
//   - tenantdb: a tenantdb.Pool with ScopeTransaction, one tenant.
//
// setting and pinned differ in the pins only: their difference is the
// pins' cost on the server.
func BenchmarkScopeTransactionPins(b *testing.B) {
	oneConn := func() *pgxpool.Config {
		cfg := pgxConfig(b)
		cfg.MaxConns, cfg.MinConns = 1, 1
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		return cfg
	}
	raw, err := pgxpool.NewWithConfig(context.Background(), oneConn())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(raw.Close)
	p, err := tenantdb.New(context.Background(), oneConn(), tenantdb.Config{
		Plans:   map[string]tenantdb.Plan{"standard": {MaxConns: 1}},
		Session: tenantdb.Session{TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction},
		Logger:  slog.New(slog.DiscardHandler), // one tenant may hold the one connection: on purpose
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	ctx := context.Background()
	var path string
	if err := raw.QueryRow(ctx, "select reset_val from pg_settings where name = 'search_path'").Scan(&path); err != nil {
		b.Fatal(err)
	}
	batch := func(local string) func(int) error {
		return func(i int) error {
			bt := &pgx.Batch{}
			bt.Queue(local)
			bt.Queue("select $1::int", i)
			br := raw.SendBatch(ctx, bt)
			_, err := br.Exec()
			var n int
			if err == nil {
				err = br.QueryRow().Scan(&n)
			}
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			return err
		}
	}
	tenant := tenantdb.WithTenant(ctx, "a")
	variants := []struct {
		name string
		run  func(int) error
	}{
		{"pgxpool", func(i int) error { var n int; return raw.QueryRow(ctx, "select $1::int", i).Scan(&n) }},
		{"setting", batch("select set_config('app.tenant_id', E'a', true)")},
		{"pinned", batch("select pg_catalog.set_config('role', E'none', true), pg_catalog.set_config('app.tenant_id', E'a', true), " +
			"pg_catalog.set_config('search_path', E'" + path + ", pg_temp', true)")},
		{"tenantdb", func(i int) error { var n int; return p.QueryRow(tenant, "select $1::int", i).Scan(&n) }},
	}
	for i := range 10 { // warm up
		for _, v := range variants {
			if err := v.run(i); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
		}
	}
	took := make([][]time.Duration, len(variants))
	n := 0
	for b.Loop() {
		for i, v := range variants {
			start := time.Now()
			if err := v.run(n); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			took[i] = append(took[i], time.Since(start))
		}
		n++
	}
	for i, v := range variants {
		slices.Sort(took[i])
		b.ReportMetric(float64(took[i][len(took[i])/2].Nanoseconds()), v.name+"-p50-ns/query")
	}
	b.ReportMetric(0, "ns/op")
}
