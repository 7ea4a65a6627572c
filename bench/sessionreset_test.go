package bench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// BenchmarkSessionReset is the cost of handing a connection from one tenant
// to another, which resets its session, against a bare pgxpool Exec. Every
// pool has one connection, so "alternating" (tenants a and b in turn) changes
// the connection's tenant on every call and "same" (tenant a only) never
// does. Each iteration runs Exec("select 1") once on every variant, in turn,
// so that the machine's drift falls on all alike; the metrics are each
// variant's time per Exec.
func BenchmarkSessionReset(b *testing.B) {
	ctxA := tenantdb.WithTenant(context.Background(), "a")
	ctxB := tenantdb.WithTenant(context.Background(), "b")
	setting := tenantdb.Session{TenantSetting: "app.tenant_id"}
	txScope := tenantdb.Session{TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction}
	type variant struct {
		name string
		exec func(i int) error
	}
	oneConn := func() *pgxpool.Config {
		cfg := pgxConfig(b)
		cfg.MaxConns, cfg.MinConns = 1, 1
		return cfg
	}
	raw, err := pgxpool.NewWithConfig(context.Background(), oneConn())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(raw.Close)
	variants := []variant{{"pgxpool", func(int) error { _, err := raw.Exec(context.Background(), "select 1"); return err }}}
	for _, s := range []struct {
		name    string
		session tenantdb.Session
	}{{"nosession", tenantdb.Session{}}, {"session", setting}, {"txscope", txScope}} {
		cfg := tenantdb.Config{Plans: map[string]tenantdb.Plan{"standard": {MaxConns: 1}}, Session: s.session}
		p, err := tenantdb.New(context.Background(), oneConn(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
		variants = append(variants,
			variant{s.name + "/same", func(int) error { _, err := p.Exec(ctxA, "select 1"); return err }},
			variant{s.name + "/alternating", func(i int) error {
				ctx := ctxA
				if i%2 == 1 {
					ctx = ctxB
				}
				_, err := p.Exec(ctx, "select 1")
				return err
			}})
	}
	for i := range 4 { // warm: connect, prepare the setup statements
		for _, v := range variants {
			if err := v.exec(i); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
		}
	}
	spent := make([]time.Duration, len(variants))
	n := 0
	for b.Loop() {
		for i, v := range variants {
			start := time.Now()
			if err := v.exec(n); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			spent[i] += time.Since(start)
		}
		n++
	}
	for i, v := range variants {
		b.ReportMetric(float64(spent[i].Nanoseconds())/float64(n), v.name+"-ns/exec")
	}
	b.ReportMetric(0, "ns/op")
}
