package bench

import (
	"context"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// BenchmarkSessionReset is the cost of handing a connection from one tenant
// to another, which resets its session, against a bare pgxpool Exec. Every
// pool has one connection, so "alternating" (tenants a and b in turn) changes
// the connection's tenant on every call and "same" (tenant a only) never
// does. Each iteration runs Exec("select 1") once on every variant, in turn,
// so that the machine's drift falls on all alike; the metrics are each
// variant's time per Exec, and its round trips per Exec (the client's writes
// to the server, counted on the socket), which a loaded machine cannot
// blur.
func BenchmarkSessionReset(b *testing.B) {
	ctxA := tenantdb.WithTenant(context.Background(), "a")
	ctxB := tenantdb.WithTenant(context.Background(), "b")
	setting := tenantdb.Session{TenantSetting: "app.tenant_id"}
	txScope := tenantdb.Session{TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction}
	type variant struct {
		name   string
		exec   func(i int) error
		writes *atomic.Int64 // the pool's writes to the server
	}
	oneConn := func(writes *atomic.Int64) *pgxpool.Config {
		cfg := pgxConfig(b)
		cfg.MaxConns, cfg.MinConns = 1, 1
		var d net.Dialer
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{c, writes}, nil
		}
		return cfg
	}
	rawWrites := new(atomic.Int64)
	raw, err := pgxpool.NewWithConfig(context.Background(), oneConn(rawWrites))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(raw.Close)
	variants := []variant{{"pgxpool", func(int) error { _, err := raw.Exec(context.Background(), "select 1"); return err }, rawWrites}}
	for _, s := range []struct {
		name    string
		session tenantdb.Session
	}{{"nosession", tenantdb.Session{}}, {"session", setting}, {"txscope", txScope}} {
		for _, alternate := range []bool{false, true} {
			name, writes := s.name+"/same", new(atomic.Int64)
			if alternate {
				name = s.name + "/alternating"
			}
			cfg := tenantdb.Config{
				Plans:   map[string]tenantdb.Plan{"standard": {MaxConns: 1}},
				Session: s.session,
				Logger:  slog.New(slog.DiscardHandler), // one tenant may hold the one connection: on purpose
			}
			pcfg := oneConn(writes)
			if s.session.Scope == tenantdb.ScopeTransaction {
				pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // as New requires
			}
			p, err := tenantdb.New(context.Background(), pcfg, cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(p.Close)
			variants = append(variants, variant{name, func(i int) error {
				ctx := ctxA
				if alternate && i%2 == 1 {
					ctx = ctxB
				}
				_, err := p.Exec(ctx, "select 1")
				return err
			}, writes})
		}
	}
	for i := range 4 { // warm: connect, prepare the setup statements
		for _, v := range variants {
			if err := v.exec(i); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
		}
	}
	spent := make([]time.Duration, len(variants))
	wrote := make([]int64, len(variants))
	for i, v := range variants {
		wrote[i] = -v.writes.Load()
	}
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
		b.ReportMetric(float64(wrote[i]+v.writes.Load())/float64(n), v.name+"-roundtrips/exec")
	}
	b.ReportMetric(0, "ns/op")
}

// countingConn counts the writes to a server connection: pgx buffers a round
// trip's messages and writes them at once.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}
