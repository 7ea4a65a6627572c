package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestOperationDurationPerCall checks db.client.operation.duration against
// real PostgreSQL: one measurement per query, batch and copy, whether or not
// the request is traced, labelled with the operation, and a failed query
// with its SQLSTATE as error.type; a sleep of 200 ms is measured as at least
// that.
func TestOperationDurationPerCall(t *testing.T) {
	e := newEnv(t)
	p := newTracedPool(t, e.tr, nil, 2, tenantdb.Config{})
	ctx := tenantdb.WithTenant(context.Background(), "acme") // no span: metrics still recorded

	table := fmt.Sprintf("tracing_opdur_%d", os.Getpid())
	if _, err := p.Exec(ctx, "create table "+table+" (n int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = p.Exec(ctx, "drop table "+table) })
	for range 3 {
		if _, err := p.Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Exec(ctx, "select pg_sleep(0.2)"); err != nil {
		t.Fatal(err)
	}
	_, err := p.Exec(ctx, "select * from no_such_table_here")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("select from a missing table: %v", err)
	}
	batchAndCopy(t, ctx, p, table)

	rm := e.collect(t)
	const name = "db.client.operation.duration"
	m, ok := metricNamed(rm, name)
	if !ok || m.Unit != "s" {
		t.Fatalf("%s: found %v, unit %q", name, ok, m.Unit)
	}
	pg := semconv.DBSystemNamePostgreSQL
	op := semconv.DBOperationName
	// Every SELECT but the failed one, 3 quick and 1 sleeping, in one
	// series; the failed one in another.
	var ok3, failed, sleeping int
	for _, pt := range points(t, rm, name) {
		if !hasAll(pt.attrs, []attribute.KeyValue{pg, op("SELECT")}) {
			continue
		}
		if et, has := pt.attrs.Value(semconv.ErrorTypeKey); has {
			if et.AsString() != "42P01" {
				t.Errorf("failed SELECT: error.type %q, want the SQLSTATE 42P01", et.AsString())
			}
			if sc, _ := pt.attrs.Value(semconv.DBResponseStatusCodeKey); sc.AsString() != "42P01" {
				t.Errorf("failed SELECT: db.response.status_code %q", sc.AsString())
			}
			failed += int(pt.value)
			continue
		}
		ok3 += int(pt.value)
		if pt.sum >= 0.2 {
			sleeping++
		}
		if got := pt.hist.Bounds; len(got) != 9 || got[0] != 0.001 || got[8] != 10 {
			t.Errorf("bucket boundaries %v, want the semantic conventions' 0.001 ... 10", got)
		}
	}
	if ok3 != 4 || failed != 1 || sleeping != 1 {
		t.Errorf("SELECT measurements: %d ok (want 4), %d failed (want 1), sum >= 0.2 s: %v", ok3, failed, sleeping == 1)
	}
	if got := value(t, rm, name, pg, op("BATCH INSERT")).value; got != 1 {
		t.Errorf("batch measurements %v, want 1", got)
	}
	if got := value(t, rm, name, pg, op("COPY")).value; got != 1 {
		t.Errorf("copy measurements %v, want 1", got)
	}
}
