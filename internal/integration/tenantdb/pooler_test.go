package tenantdb_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// logBuffer is an io.Writer for a slog handler, safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns how many logged lines contain s.
func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

// TestPoolerDetected: New's pool warns once through Config.Logger when a
// Session with ScopeSession runs behind a pooler, and never on a direct
// connection or with ScopeTransaction; CheckServer reports the pooler,
// whose limit it cannot see, and does not call a demand fitting until the
// pooler's limit is given.
func TestPoolerDetected(t *testing.T) {
	bouncer := tenantdbtest.StartPgBouncer(t, sharedPG,
		tenantdbtest.WithPoolMode(tenantdbtest.PoolModeTransaction), tenantdbtest.WithPoolSize(2))
	const warning = "pooler or proxy"
	for _, c := range []struct {
		name   string
		dsn    string
		scope  tenantdb.Scope
		warned int
	}{
		{"ScopeSession direct", sharedPG.DSN, tenantdb.ScopeSession, 0},
		{"ScopeSession behind PgBouncer", bouncer.DSN, tenantdb.ScopeSession, 1},
		{"ScopeTransaction behind PgBouncer", bouncer.DSN + "&default_query_exec_mode=exec", tenantdb.ScopeTransaction, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs := &logBuffer{}
			p, err := tenantdb.New(context.Background(), pgxConfig(t, &tenantdbtest.Postgres{DSN: c.dsn}, 4), tenantdb.Config{
				Plans:   map[string]tenantdb.Plan{"std": {MaxConns: 4}},
				Session: tenantdb.Session{TenantSetting: "app.tenant_id", Scope: c.scope},
				Logger:  slog.New(slog.NewTextHandler(logs, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			// Four connections at once: the check runs on the first only.
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					if _, err := p.Exec(as("acme"), "select pg_sleep(0.05)"); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			if opened := p.Stat().TotalConns(); opened < 2 {
				t.Fatalf("%d connections opened, want several", opened)
			}
			if n := logs.count(warning); n != c.warned {
				t.Errorf("%d warnings about a pooler, want %d; logs:\n%s", n, c.warned, logs.buf.String())
			}
			s, err := p.CheckServer(context.Background(), 1)
			if err != nil {
				t.Fatal(err)
			}
			if behind := c.dsn != sharedPG.DSN; s.BehindPooler != behind {
				t.Errorf("CheckServer: BehindPooler %t, want %t", s.BehindPooler, behind)
			}
			// The server takes 297 connections, PgBouncer's pool 2: behind
			// it, a demand of 4 is unknown until the pooler's limit is
			// given, and then does not fit.
			if s.Demand != 4 || s.MaxConnections < s.Demand {
				t.Fatalf("CheckServer: %+v", s)
			}
			if s.BehindPooler {
				if s.Known() || s.Fits() {
					t.Errorf("behind PgBouncer without its limit: Known %t, Fits %t; want neither", s.Known(), s.Fits())
				}
				if s := s.WithPoolerLimit(2); !s.Known() || s.Fits() {
					t.Errorf("behind PgBouncer's pool of 2: Known %t, Fits %t; want known, not fitting", s.Known(), s.Fits())
				}
				if s := s.WithPoolerLimit(24); !s.Fits() {
					t.Errorf("behind a pool of 24: %+v does not fit", s)
				}
			} else if !s.Known() || !s.Fits() {
				t.Errorf("direct: Known %t, Fits %t; want both", s.Known(), s.Fits())
			}
			assertNothingHeld(t, p)
		})
	}
}
