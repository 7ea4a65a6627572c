package tracing_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tracing"
)

// TestScopeTransactionSpansNameTheApplicationsStatement: under
// ScopeTransaction tenantdb sends the tenant's setting as the first query
// of a batch (or in front of a simple-protocol query). A plain select must
// still be a span called "SELECT <db>" whose db.query.text is the
// application's SQL, with no set_config in it and no tenant ID, and one
// db.client.operation.duration series, SELECT, as under ScopeSession.
func TestScopeTransactionSpansNameTheApplicationsStatement(t *testing.T) {
	pg := postgres(t)
	for name, scope := range map[string]tenantdb.Scope{"ScopeSession": tenantdb.ScopeSession, "ScopeTransaction": tenantdb.ScopeTransaction} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			pcfg, err := pgxpool.ParseConfig(pg.DSN)
			if err != nil {
				t.Fatal(err)
			}
			pcfg.MaxConns = 2
			pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
			p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
				Tracer:  e.tr,
				Session: tenantdb.Session{TenantSetting: "app.tenant_id", Scope: scope},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()

			ctx, root := e.root(tenantdb.WithTenant(context.Background(), "secret-tenant"))
			var n int
			if err := p.QueryRow(ctx, "select $1::int", 1).Scan(&n); err != nil { // a batch under ScopeTransaction
				t.Fatal(err)
			}
			if _, err := p.Exec(ctx, "select 2"); err != nil { // the setting in front, simple protocol
				t.Fatal(err)
			}
			rows, err := p.Query(ctx, "select generate_series(1, 3)")
			if err != nil {
				t.Fatal(err)
			}
			rows.Close()
			if _, err := p.Exec(ctx, "select $1::int", 3); err != nil {
				t.Fatal(err)
			}
			root.End()

			want := map[string]bool{"select $1::int": true, "select 2": true, "select generate_series(1, 3)": true}
			seen := map[string]int{}
			for _, s := range e.spans.Ended() {
				if s.Name() == "request" || s.Name() == tracing.AcquireSpanName || s.Name() == tracing.ConnectSpanName {
					continue
				}
				text, _ := attr(s, semconv.DBQueryTextKey)
				op, _ := attr(s, semconv.DBOperationNameKey)
				if strings.Contains(text.AsString(), "set_config") || strings.Contains(text.AsString(), "secret-tenant") {
					t.Errorf("span %q: db.query.text %q holds tenantdb's setting", s.Name(), text.AsString())
				}
				if !want[text.AsString()] {
					continue // the Pool's own statements, made on no request's behalf
				}
				seen[text.AsString()]++
				if s.Name() != "SELECT "+pg.Database || op.AsString() != "SELECT" {
					t.Errorf("span of %q: name %q, db.operation.name %q; want SELECT %s, SELECT",
						text.AsString(), s.Name(), op.AsString(), pg.Database)
				}
				if _, batch := attr(s, semconv.DBOperationBatchSizeKey); batch {
					t.Errorf("span of %q has a batch size", text.AsString())
				}
			}
			if seen["select $1::int"] != 2 || seen["select 2"] != 1 || seen["select generate_series(1, 3)"] != 1 {
				t.Errorf("spans of the application's statements: %v", seen)
			}
			rm := e.collect(t)
			ops := map[string]bool{}
			for _, pt := range points(t, rm, "db.client.operation.duration") {
				v, _ := pt.attrs.Value(semconv.DBOperationNameKey)
				ops[v.AsString()] = true
			}
			if !ops["SELECT"] {
				t.Errorf("db.client.operation.duration operations %v: no SELECT", ops)
			}
			for op := range ops {
				if strings.HasPrefix(op, "BATCH") {
					t.Errorf("db.client.operation.duration operations %v: a plain select became %q", ops, op)
				}
			}
		})
	}
}
