package tenantdb_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// lazyConfig is a pgxpool config for tests that never reach the server:
// pgxpool connects lazily, and these requests are refused before that.
func lazyConfig(t *testing.T, maxConns int32) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	return cfg
}

// everyCall runs each Pool method with ctx and returns what it failed with.
func everyCall(p *tenantdb.Pool, ctx context.Context) map[string]error {
	errs := map[string]error{}
	_, errs["Exec"] = p.Exec(ctx, "select 1")
	_, errs["Query"] = p.Query(ctx, "select 1")
	errs["QueryRow"] = p.QueryRow(ctx, "select 1").Scan(new(int))
	_, errs["Begin"] = p.Begin(ctx)
	_, errs["BeginTx"] = p.BeginTx(ctx, pgx.TxOptions{})
	b := &pgx.Batch{}
	b.Queue("select 1")
	errs["SendBatch"] = p.SendBatch(ctx, b).Close()
	_, errs["CopyFrom"] = p.CopyFrom(ctx, pgx.Identifier{"t"}, []string{"n"}, pgx.CopyFromRows(nil))
	_, errs["Acquire"] = p.Acquire(ctx)
	errs["AcquireFunc"] = p.AcquireFunc(ctx, func(tenantdb.Conn) error { return nil })
	errs["Ping"] = p.Ping(ctx)
	return errs
}

func TestBadTenantIsRefusedByEveryMethod(t *testing.T) {
	p, err := tenantdb.New(context.Background(), lazyConfig(t, 4), tenantdb.Config{MaxTenantIDLen: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for name, ctx := range map[string]context.Context{
		"no tenant":     context.Background(),
		"empty tenant":  tenantdb.WithTenant(context.Background(), ""),
		"over-long":     tenantdb.WithTenant(context.Background(), strings.Repeat("a", 33)),
		"control chars": tenantdb.WithTenant(context.Background(), "acme\r\n"),
	} {
		for method, err := range everyCall(p, ctx) {
			if name == "no tenant" && method == "Ping" {
				// A health check: it needs no tenant (see TestHealthCheckPing);
				// here it reaches for the unreachable server.
				if errors.Is(err, tenantdb.ErrNoTenant) || err == nil {
					t.Errorf("Ping without a tenant: err = %v, want the server's connection error", err)
				}
				continue
			}
			if !errors.Is(err, tenantdb.ErrNoTenant) {
				t.Errorf("%s: %s: err = %v, want ErrNoTenant", name, method, err)
			}
			if name != "no tenant" && !errors.Is(err, pool.ErrInvalidTenant) {
				t.Errorf("%s: %s: err = %v, want it to say why (ErrInvalidTenant)", name, method, err)
			}
		}
	}
	if s := p.Stat(); s.Tenants.Tenants != 0 || s.Tenants.InUse != 0 || s.TotalConns() != 0 {
		t.Fatalf("refused requests left state: %+v", s.Tenants)
	}
}

func TestLookupProblemsAreSurfaced(t *testing.T) {
	directoryDown := errors.New("tenant directory unavailable")
	p, err := tenantdb.New(context.Background(), lazyConfig(t, 4), tenantdb.Config{
		Plans:       map[string]tenantdb.Plan{"free": {MaxConns: 1}, "standard": {MaxConns: 2}},
		DefaultPlan: "standard",
		Lookup: func(_ context.Context, id string) (tenantdb.Tenant, error) {
			if id == "down" {
				return tenantdb.Tenant{}, directoryDown
			}
			return tenantdb.Tenant{Plan: "platinum"}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for method, err := range everyCall(p, as("down")) {
		if !errors.Is(err, directoryDown) {
			t.Errorf("Lookup error: %s: err = %v", method, err)
		}
	}
	for method, err := range everyCall(p, as("acme")) {
		if !errors.Is(err, pool.ErrUnknownPlan) || !strings.Contains(err.Error(), "platinum") {
			t.Errorf("unknown plan: %s: err = %v", method, err)
		}
	}
	if s := p.Stat(); s.Tenants.Tenants != 0 || s.TotalConns() != 0 {
		t.Fatalf("failed lookups left state: %+v", s.Tenants)
	}
}

func TestUseAfterClose(t *testing.T) {
	p, err := tenantdb.New(context.Background(), lazyConfig(t, 4), tenantdb.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Close() // idempotent
	for method, err := range everyCall(p, as("acme")) {
		if !errors.Is(err, tenantdb.ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", method, err)
		}
	}
	if err := p.Ping(context.Background()); !errors.Is(err, tenantdb.ErrClosed) {
		t.Errorf("Ping without a tenant after Close: err = %v, want ErrClosed", err)
	}
}

func TestConfigsThatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  tenantdb.Config
		want string
	}{
		{"plan cap above MaxConns", tenantdb.Config{Plans: map[string]tenantdb.Plan{"ent": {MaxConns: 50}}}, "above the capacity 20"},
		{"reservation above MaxConns", tenantdb.Config{Plans: map[string]tenantdb.Plan{"ent": {MaxConns: 20, ReservedConns: 25}}}, "ReservedConns"},
		{"reservation above MaxReserved", tenantdb.Config{Plans: map[string]tenantdb.Plan{"ent": {MaxConns: 20, ReservedConns: 15}}}, "MaxReserved"},
		{"unknown default plan", tenantdb.Config{Plans: map[string]tenantdb.Plan{"a": {MaxConns: 1}}, DefaultPlan: "b"}, `"b"`},
		{"negative queue", tenantdb.Config{Plans: map[string]tenantdb.Plan{"a": {MaxConns: 1, MaxWaiting: -5}}}, "MaxWaiting"},
		{"Capacity other than MaxConns", tenantdb.Config{Capacity: 10}, "Capacity is the pgxpool.Config's MaxConns 20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tenantdb.New(context.Background(), lazyConfig(t, 20), tc.cfg)
			if !errors.Is(err, pool.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
	p, err := tenantdb.New(context.Background(), lazyConfig(t, 20), tenantdb.Config{Capacity: 20})
	if err != nil {
		t.Fatalf("Capacity equal to MaxConns: %v", err)
	}
	p.Close()
	if _, err := tenantdb.New(context.Background(), nil, tenantdb.Config{}); err == nil {
		t.Fatal("nil pgxpool.Config accepted")
	}
}
