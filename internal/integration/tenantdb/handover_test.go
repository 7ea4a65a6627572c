package tenantdb_test

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// countWrites makes pcfg's connections count their writes to the server in
// n (pgx writes the messages of one round trip at once), and the writes of
// tenantdb's reset at release, which runs after the call, in resets.
func countWrites(pcfg *pgxpool.Config, n, resets *atomic.Int64) {
	var d net.Dialer
	pcfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{c, n, resets}, nil
	}
}

type writeCounter struct {
	net.Conn
	n, resets *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("reset all; close all;")) {
		c.resets.Add(1)
	} else {
		c.n.Add(1)
	}
	return c.Conn.Write(p)
}

// TestHandoverAddsNoRoundTrip counts, on the socket, the round trips of each
// of the Pool's statement methods when the one shared connection changes
// tenant, against the same call by the tenant that holds it and against raw
// pgxpool: equal on the caller's path, with no Session and with
// ScopeTransaction; ScopeSession adds the one round trip that sets the new
// tenant's values. The reset runs at release, off the caller's path: one
// write after every call. On the same tenant every call takes pgxpool's
// round trips, with ScopeSession too (the reset at release gives the
// session its holder's values again). No timing is measured.
func TestHandoverAddsNoRoundTrip(t *testing.T) {
	type call struct {
		name  string
		extra int64 // round trips a change of tenant may add
		run   func(ctx context.Context, db pgxDB) error
	}
	calls := []call{
		{"Exec", 0, func(ctx context.Context, db pgxDB) error {
			_, err := db.Exec(ctx, "select $1::int", 1)
			return err
		}},
		{"Exec without arguments", 0, func(ctx context.Context, db pgxDB) error {
			_, err := db.Exec(ctx, "select 1; select 2")
			return err
		}},
		{"Query", 0, func(ctx context.Context, db pgxDB) error {
			rows, err := db.Query(ctx, "select generate_series(1, $1::int)", 3)
			if err != nil {
				return err
			}
			_, err = pgx.CollectRows(rows, pgx.RowTo[int32])
			return err
		}},
		{"QueryRow", 0, func(ctx context.Context, db pgxDB) error {
			var n int
			return db.QueryRow(ctx, "select $1::int", 1).Scan(&n)
		}},
		{"SendBatch", 0, func(ctx context.Context, db pgxDB) error {
			b := &pgx.Batch{}
			b.Queue("select $1::int", 1)
			b.Queue("select $1::int + 1", 1)
			return db.SendBatch(ctx, b).Close()
		}},
		{"Begin", 0, func(ctx context.Context, db pgxDB) error {
			return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "select $1::int", 1)
				return err
			})
		}},
		{"Acquire", 0, func(ctx context.Context, db pgxDB) error {
			switch db := db.(type) {
			case *tenantdb.Pool:
				return db.AcquireFunc(ctx, func(c tenantdb.Conn) error {
					_, err := c.Exec(ctx, "select $1::int", 1)
					return err
				})
			case *pgxpool.Pool:
				return db.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
					_, err := c.Exec(ctx, "select $1::int", 1)
					return err
				})
			}
			panic("unknown pool")
		}},
	}
	sessions := map[string]tenantdb.Session{
		"no Session":       {},
		"ScopeSession":     {TenantSetting: "app.tenant_id"},
		"ScopeTransaction": {TenantSetting: "app.tenant_id", Scope: tenantdb.ScopeTransaction},
	}
	for name, session := range sessions {
		t.Run(name, func(t *testing.T) {
			// ScopeTransaction needs an exec mode that parses nothing
			// outside the transaction; pgxpool runs in the same mode.
			mode := pgx.QueryExecModeCacheStatement
			if session.Scope == tenantdb.ScopeTransaction {
				mode = pgx.QueryExecModeExec
			}
			rawWrites, rawResets := new(atomic.Int64), new(atomic.Int64)
			rcfg := pgxConfig(t, sharedPG, 1)
			rcfg.ConnConfig.DefaultQueryExecMode = mode
			countWrites(rcfg, rawWrites, rawResets)
			raw, err := pgxpool.NewWithConfig(context.Background(), rcfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(raw.Close)
			writes, resets := new(atomic.Int64), new(atomic.Int64)
			pcfg := pgxConfig(t, sharedPG, 1)
			pcfg.ConnConfig.DefaultQueryExecMode = mode
			countWrites(pcfg, writes, resets)
			p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
				Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 1}},
				Session: session,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			// count runs f and returns its writes, once the reset at
			// release is done (the connection is back in the pool).
			count := func(n *atomic.Int64, f func() error) int64 {
				t.Helper()
				before, resetsBefore := n.Load(), resets.Load()
				if err := f(); err != nil {
					t.Fatal(err)
				}
				if n == writes {
					eventually(t, "the connection is back", func() bool { return p.Stat().IdleConns() == 1 })
					if r := resets.Load() - resetsBefore; r != 1 {
						t.Errorf("%d resets at release after one call, want 1", r)
					}
				}
				return n.Load() - before
			}
			extra := int64(0)
			if session.Scope == tenantdb.ScopeSession && session.TenantSetting != "" {
				extra = 1 // the new tenant's values
			}
			for _, c := range calls {
				pooled := func(tenant string) func() error {
					return func() error { return c.run(as(tenant), p) }
				}
				// Warm: connect, and let pgx prepare every statement.
				for _, tenant := range []string{"a", "b", "a", "b"} {
					count(writes, pooled(tenant))
				}
				count(rawWrites, func() error { return c.run(context.Background(), raw) })
				want := count(rawWrites, func() error { return c.run(context.Background(), raw) })
				same := count(writes, pooled("b"))
				handover := count(writes, pooled("a"))
				if same != want {
					t.Errorf("%s: %d round trips for the tenant that holds the connection, pgxpool %d", c.name, same, want)
				}
				if handover > want+c.extra+extra {
					t.Errorf("%s: %d round trips after a change of tenant, pgxpool %d (at most %d more allowed)",
						c.name, handover, want, c.extra+extra)
				}
				t.Logf("%s: pgxpool %d, same tenant %d, change of tenant %d", c.name, want, same, handover)
			}
			assertNothingHeld(t, p)
		})
	}
}

// pgxDB is what the calls of TestHandoverAddsNoRoundTrip need of a pool:
// both *pgxpool.Pool and *tenantdb.Pool have it.
type pgxDB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Begin(ctx context.Context) (pgx.Tx, error)
}
