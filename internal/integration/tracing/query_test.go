package tracing_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tracing"
)

// newTracedPool builds a tenantdb.Pool with tr as its Tracer; own, if not
// nil, is the user's pgx tracer already in the pgxpool.Config.
func newTracedPool(t testing.TB, tr *tracing.Tracer, own pgx.QueryTracer, maxConns int32, cfg tenantdb.Config) *tenantdb.Pool {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(postgres(t).DSN)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = maxConns
	pcfg.ConnConfig.Tracer = own
	if tr != nil {
		cfg.Tracer = tr
	}
	p, err := tenantdb.New(context.Background(), pcfg, cfg)
	if err != nil {
		t.Fatalf("tenantdb.New: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestQuerySpansFollowDatabaseConventions runs each kind of call through a
// tenantdb.Pool and checks its span's name, kind, parent and attributes.
func TestQuerySpansFollowDatabaseConventions(t *testing.T) {
	e := newEnv(t)
	p := newTracedPool(t, e.tr, nil, 2, tenantdb.Config{})
	pg := postgres(t)
	host, port, _ := net.SplitHostPort(pg.Addr)
	portN, _ := strconv.Atoi(port)

	// The table is made on a connection of its own, so that the pool's
	// first connection is opened by the traced request below.
	table := fmt.Sprintf("tracing_copy_%d", os.Getpid())
	admin, err := pgx.Connect(context.Background(), pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(context.Background(), "create table "+table+" (n int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "drop table "+table)
		_ = admin.Close(context.Background())
	})

	ctx, root := e.root(tenantdb.WithTenant(context.Background(), "acme"))
	if _, err := p.Exec(ctx, "select $1::int", 1); err != nil {
		t.Fatal(err)
	}
	rows, err := p.Query(ctx, "/* list */ SELECT generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	batchAndCopy(t, ctx, p, table)
	if _, err := p.Exec(ctx, "select 1/0"); err == nil {
		t.Fatal("division by zero succeeded")
	}
	root.End()

	common := []attribute.KeyValue{
		semconv.DBSystemNamePostgreSQL, semconv.DBNamespace(pg.Database),
		semconv.ServerAddress(host), semconv.ServerPort(portN), tracing.TenantKey.String("acme"),
	}
	// check finds the span called name with all of common and want.
	check := func(name string, want ...attribute.KeyValue) {
		t.Helper()
		want = append(append([]attribute.KeyValue(nil), common...), want...)
		var found []string
		for _, s := range e.ended(name) {
			if !hasAll(attribute.NewSet(s.Attributes()...), want) {
				found = append(found, fmt.Sprint(s.Attributes()))
				continue
			}
			if s.SpanKind() != trace.SpanKindClient {
				t.Errorf("%s: kind %v", name, s.SpanKind())
			}
			if s.Parent().TraceID() != root.SpanContext().TraceID() {
				t.Errorf("%s: not in the request's trace", name)
			}
			return
		}
		var all []string
		for _, s := range e.spans.Ended() {
			all = append(all, s.Name())
		}
		t.Errorf("no span %q with %v;\nspans of that name: %v\nall spans: %v", name, want, found, all)
	}
	db := pg.Database
	check("SELECT "+db, semconv.DBOperationName("SELECT"), semconv.DBQueryText("select $1::int"))
	check("SELECT "+db, semconv.DBQueryText("/* list */ SELECT generate_series(1, 3)"), semconv.DBResponseReturnedRows(3))
	check("BATCH INSERT "+db, semconv.DBOperationName("BATCH INSERT"), semconv.DBOperationBatchSize(2),
		semconv.DBQueryText("insert into "+table+" values (1); insert into "+table+" values (2)"))
	check("COPY "+`"`+table+`"`, semconv.DBOperationName("COPY"), semconv.DBCollectionName(`"`+table+`"`))
	check("PREPARE "+db, semconv.DBQueryText("select $1::int"))
	check(tracing.ConnectSpanName)

	// The failed query: SQLSTATE 22012, status Error.
	var failed bool
	for _, s := range e.ended("SELECT " + db) {
		if v, _ := attr(s, semconv.DBQueryTextKey); v.AsString() != "select 1/0" {
			continue
		}
		failed = true
		if s.Status().Code != codes.Error || mustAttr(t, s, semconv.DBResponseStatusCodeKey).AsString() != "22012" ||
			mustAttr(t, s, semconv.ErrorTypeKey).AsString() != "22012" {
			t.Errorf("failed query: status %v, attributes %v", s.Status(), s.Attributes())
		}
	}
	if !failed {
		t.Error("no span for the failed query")
	}
	// Admission spans are siblings of the query spans, under the request.
	if n := len(e.ended(tracing.AcquireSpanName)); n != 5 {
		t.Errorf("%d admission spans, want 5", n)
	}
	for _, s := range e.ended(tracing.AcquireSpanName) {
		if s.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("admission span outside the request span")
		}
	}
}

// TestWithoutQueryTextLeavesSQLOut checks WithoutQueryText, and that the
// operation is still named.
func TestWithoutQueryTextLeavesSQLOut(t *testing.T) {
	e := newEnv(t, tracing.WithoutQueryText())
	p := newTracedPool(t, e.tr, nil, 2, tenantdb.Config{})
	ctx, root := e.root(tenantdb.WithTenant(context.Background(), "acme"))
	if _, err := p.Exec(ctx, "select 'secret'"); err != nil {
		t.Fatal(err)
	}
	root.End()
	for _, s := range e.spans.Ended() {
		if _, ok := attr(s, semconv.DBQueryTextKey); ok {
			t.Errorf("span %q has db.query.text", s.Name())
		}
	}
	if s := e.ended("SELECT " + postgres(t).Database); len(s) != 1 || mustAttr(t, s[0], semconv.DBOperationNameKey).AsString() != "SELECT" {
		t.Errorf("query span without text: %d spans", len(s))
	}
}

// userTracer is a user's own pgx tracer, as otelpgx would be: it records
// the SQL it sees and starts spans of its own in the same trace.
type userTracer struct {
	tp     trace.TracerProvider
	mu     sync.Mutex
	sqls   []string
	starts int
}

type userSpanKey struct{}

func (u *userTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	u.mu.Lock()
	u.sqls = append(u.sqls, d.SQL)
	u.starts++
	u.mu.Unlock()
	ctx, span := u.tp.Tracer("user").Start(ctx, "user query")
	return context.WithValue(ctx, userSpanKey{}, span)
}

func (u *userTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	ctx.Value(userSpanKey{}).(trace.Span).End()
}

// TestComposesWithUserPgxTracer checks that a user's pgx tracer in the
// pgxpool.Config keeps seeing every query next to the Tracer, that both
// tracers' spans are ended, and the Tracer's query span nests under the
// user's span (tenantdb chains the user's tracer first).
func TestComposesWithUserPgxTracer(t *testing.T) {
	e := newEnv(t)
	own := &userTracer{tp: e.tp}
	p := newTracedPool(t, e.tr, own, 2, tenantdb.Config{})
	ctx, root := e.root(tenantdb.WithTenant(context.Background(), "acme"))
	for i := range 3 {
		if _, err := p.Exec(ctx, fmt.Sprintf("select %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	root.End()
	own.mu.Lock()
	defer own.mu.Unlock()
	if fmt.Sprint(own.sqls) != "[select 0 select 1 select 2]" {
		t.Errorf("the user's tracer saw %v", own.sqls)
	}
	users, ours := e.ended("user query"), e.ended("SELECT "+postgres(t).Database)
	if len(users) != 3 || len(ours) != 3 {
		t.Fatalf("%d user spans and %d of ours, want 3 each (ended)", len(users), len(ours))
	}
	for i := range ours {
		if ours[i].Parent().SpanID() != users[i].SpanContext().SpanID() {
			t.Errorf("query %d: our span's parent is not the user's span", i)
		}
	}
}

// TestWithoutQuerySpansKeepsAdmissionSpans checks WithoutQuerySpans, for
// services that trace pgx themselves.
func TestWithoutQuerySpansKeepsAdmissionSpans(t *testing.T) {
	e := newEnv(t, tracing.WithoutQuerySpans())
	own := &userTracer{tp: e.tp}
	p := newTracedPool(t, e.tr, own, 2, tenantdb.Config{})
	ctx, root := e.root(tenantdb.WithTenant(context.Background(), "acme"))
	if _, err := p.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	root.End()
	var names []string
	for _, s := range e.spans.Ended() {
		names = append(names, s.Name())
	}
	if fmt.Sprint(names) != "[tenantdb.acquire user query request]" {
		t.Errorf("spans %v, want the admission span, the user's and the request", names)
	}
}

// TestObservePoolReportsPgxpool checks ObservePool's connection counts, read
// from the shared pgxpool, with one connection held by a tenant.
func TestObservePoolReportsPgxpool(t *testing.T) {
	e := newEnv(t, tracing.WithPoolName("orders"))
	p := newTracedPool(t, e.tr, nil, 3, tenantdb.Config{})
	stop, err := e.tr.ObservePool(p)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx := tenantdb.WithTenant(context.Background(), "acme")
	if _, err := p.Exec(ctx, "select 1"); err != nil { // leaves an idle connection
		t.Fatal(err)
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	rm := e.collect(t)
	name := semconv.DBClientConnectionPoolName("orders")
	used := value(t, rm, "db.client.connection.count", name, semconv.DBClientConnectionStateUsed).value
	idle := value(t, rm, "db.client.connection.count", name, semconv.DBClientConnectionStateIdle).value
	if s := p.Pgxpool().Stat(); used != 1 || idle != float64(s.IdleConns()) {
		t.Errorf("count: used %v idle %v; pgxpool says %d and %d", used, idle, s.AcquiredConns(), s.IdleConns())
	}
	if got := value(t, rm, "db.client.connection.max", name).value; got != 3 {
		t.Errorf("max %v, want 3", got)
	}
	if got := value(t, rm, "tenantdb.tenant.connection.count", tracing.TenantKey.String("acme")).value; got != 1 {
		t.Errorf("tenant count{acme} %v, want 1", got)
	}
}
