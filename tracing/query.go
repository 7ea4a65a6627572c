package tracing

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// Context keys of the spans the pgx hooks start, one per kind, so that an
// End never ends a span of another kind, nor another tracer's (a user's pgx
// tracer chained with this one puts its own spans in the same contexts).
type (
	querySpanKey   struct{}
	batchSpanKey   struct{}
	copySpanKey    struct{}
	prepareSpanKey struct{}
	connectSpanKey struct{}
)

// connInfo is what query spans say about a connection. It is computed once
// per connection, at connect or at its first traced query, and kept in the
// connection's CustomData: pgx.Conn.Config copies the whole configuration,
// too much to do per query.
type connInfo struct {
	attrs     []attribute.KeyValue // db.system.name, db.namespace, server.address, server.port
	namespace string

	// What db.client.operation.duration needs between a call's start and
	// end hooks. pgx runs one call at a time on a connection, and only the
	// goroutine that holds the connection runs its hooks, so these need no
	// lock; keeping them here instead of in the context saves an allocation
	// per query.
	queryCall, batchCall, copyCall call
	// okOpts caches the measurement options of successful calls by
	// operation name: the attribute set is built once per operation and
	// connection, not per query.
	okOpts map[string][]metric.RecordOption
	// opNames caches operationName by the keyword as written, so that
	// lower-case SQL is upper-cased once per connection, not per query.
	opNames map[string]string
}

// call is one timed call on a connection.
type call struct {
	start time.Time // zero: not timed
	op    string
}

const connInfoKey = "github.com/tenantdb/tenantdb/tracing.connInfo"

var noConnInfo = &connInfo{attrs: []attribute.KeyValue{semconv.DBSystemNamePostgreSQL}}

func newConnInfo(cfg *pgx.ConnConfig) *connInfo {
	if cfg == nil {
		return noConnInfo
	}
	ci := &connInfo{namespace: cfg.Database}
	ci.attrs = append(ci.attrs, semconv.DBSystemNamePostgreSQL)
	if cfg.Database != "" {
		ci.attrs = append(ci.attrs, semconv.DBNamespace(cfg.Database))
	}
	if cfg.Host != "" {
		ci.attrs = append(ci.attrs, semconv.ServerAddress(cfg.Host))
	}
	if cfg.Port != 0 {
		ci.attrs = append(ci.attrs, semconv.ServerPort(int(cfg.Port)))
	}
	return ci
}

func connInfoOf(conn *pgx.Conn) *connInfo {
	if conn == nil {
		return noConnInfo
	}
	pc := conn.PgConn()
	if pc != nil {
		if ci, ok := pc.CustomData()[connInfoKey].(*connInfo); ok {
			return ci
		}
	}
	ci := newConnInfo(conn.Config())
	if pc != nil && pc.CustomData() != nil {
		pc.CustomData()[connInfoKey] = ci // the caller owns conn: no one else touches it now
	}
	return ci
}

// wantSpan reports whether a pgx hook should start a span for ctx.
func (t *Tracer) wantSpan(ctx context.Context) bool {
	return t.cfg.querySpans && (t.cfg.rootSpans || trace.SpanFromContext(ctx).IsRecording())
}

// appendTenant adds the tenant of ctx, if any.
func appendTenant(ctx context.Context, attrs []attribute.KeyValue) []attribute.KeyValue {
	if id, ok := tenantdb.TenantFrom(ctx); ok {
		if kv, ok := tenantAttr(id); ok {
			attrs = append(attrs, kv)
		}
	}
	return attrs
}

// spanName follows the semantic conventions: "{db.operation.name} {target}",
// the target being the database.
func spanName(op, namespace string) string {
	switch {
	case op != "" && namespace != "":
		return op + " " + namespace
	case op != "":
		return op
	case namespace != "":
		return namespace
	}
	return "postgresql"
}

// startDBSpan starts a client span for a database call and stores it under key.
func (t *Tracer) startDBSpan(ctx context.Context, key any, name string, attrs []attribute.KeyValue) context.Context {
	sctx, span := t.startSpan(ctx, name, trace.SpanKindClient, attrs...)
	if span == nil {
		return ctx
	}
	return context.WithValue(sctx, key, span)
}

// endDBSpan ends the span stored under key, if this Tracer started one.
func endDBSpan(ctx context.Context, key any, err error) {
	if span, ok := ctx.Value(key).(trace.Span); ok {
		finishSpan(span, err)
	}
}

func finishSpan(span trace.Span, err error) {
	if err != nil {
		setError(span, err)
	}
	span.End()
}

// setError records err on span with the semantic conventions' attributes:
// PostgreSQL's SQLSTATE as db.response.status_code and error.type.
func setError(span trace.Span, err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		span.SetAttributes(semconv.DBResponseStatusCode(pgErr.Code), semconv.ErrorTypeKey.String(pgErr.Code))
	} else {
		span.SetAttributes(semconv.ErrorType(err))
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// TraceQueryStart starts a query span (Exec, Query, QueryRow) and times the
// query for db.client.operation.duration.
func (t *Tracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	timed := t.opDuration.Enabled(ctx)
	if !timed && !t.wantSpan(ctx) {
		return ctx
	}
	ci := connInfoOf(conn)
	spanned := t.wantSpan(ctx)
	if !spanned && ci == noConnInfo {
		return ctx // no connection to time the call on
	}
	sql := appSQL(data.SQL)
	op := ci.operationName(sql)
	if timed {
		ci.startCall(&ci.queryCall, op)
	}
	if !spanned {
		return ctx
	}
	attrs := make([]attribute.KeyValue, 0, len(ci.attrs)+3)
	attrs = append(attrs, ci.attrs...)
	if op != "" {
		attrs = append(attrs, semconv.DBOperationName(op))
	}
	if t.cfg.queryText {
		attrs = append(attrs, semconv.DBQueryText(sql))
	}
	attrs = appendTenant(ctx, attrs)
	return t.startDBSpan(ctx, querySpanKey{}, spanName(op, ci.namespace), attrs)
}

// TraceQueryEnd ends the query span and records the query's duration.
func (t *Tracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	t.endCall(ctx, conn, func(ci *connInfo) *call { return &ci.queryCall }, data.Err)
	span, ok := ctx.Value(querySpanKey{}).(trace.Span)
	if !ok {
		return // nothing to build attributes for: the unsampled path allocates nothing
	}
	if data.Err == nil && data.CommandTag.Select() {
		span.SetAttributes(semconv.DBResponseReturnedRows(int(data.CommandTag.RowsAffected())))
	}
	finishSpan(span, data.Err)
}

// appSQL is sql without the statement tenantdb puts in front of it under
// ScopeTransaction (see tenantdb.TrimSessionStatement), or sql itself when
// that statement is all there is.
func appSQL(sql string) string {
	if app := tenantdb.TrimSessionStatement(sql); strings.TrimSpace(app) != "" {
		return app
	}
	return sql
}

// appQueries is queries without the statements that set a tenant's values
// (tenantdb.IsSessionStatement), which tenantdb adds to a batch under
// ScopeTransaction; queries itself when it has none, or only those.
func appQueries(queries []*pgx.QueuedQuery) []*pgx.QueuedQuery {
	n := 0
	for _, q := range queries {
		if tenantdb.IsSessionStatement(q.SQL) {
			n++
		}
	}
	if n == 0 || n == len(queries) {
		return queries
	}
	app := make([]*pgx.QueuedQuery, 0, len(queries)-n)
	for _, q := range queries {
		if !tenantdb.IsSessionStatement(q.SQL) {
			app = append(app, q)
		}
	}
	return app
}

// TraceBatchStart starts a batch span. Its operation is "BATCH" followed by
// the queries' operation when they all have the same one, and its query
// text the queries joined by "; ", as the semantic conventions say. The
// statement that sets the tenant's values under ScopeTransaction is left
// out: a batch that tenantdb made of it and one statement of the
// application's (a Query, QueryRow or Exec with arguments) is named, timed
// and shown as that statement, as the same call is under ScopeSession.
func (t *Tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	timed := t.opDuration.Enabled(ctx)
	if !timed && !t.wantSpan(ctx) {
		return ctx
	}
	ci := connInfoOf(conn)
	var queries []*pgx.QueuedQuery
	if data.Batch != nil {
		queries = data.Batch.QueuedQueries
	}
	wrapped := false
	if app := appQueries(queries); len(app) != len(queries) {
		queries, wrapped = app, len(app) == 1
	}
	op := "BATCH"
	for i, q := range queries {
		qop := ci.operationName(q.SQL)
		if i == 0 {
			op = "BATCH " + qop
		} else if "BATCH "+qop != op {
			op = "BATCH"
			break
		}
	}
	op = strings.TrimSpace(op)
	if wrapped {
		op = ci.operationName(queries[0].SQL)
	}
	if timed {
		ci.startCall(&ci.batchCall, op)
	}
	if !t.wantSpan(ctx) {
		return ctx
	}
	attrs := make([]attribute.KeyValue, 0, len(ci.attrs)+4)
	attrs = append(attrs, ci.attrs...)
	if op != "" {
		attrs = append(attrs, semconv.DBOperationName(op))
	}
	if len(queries) >= 2 {
		attrs = append(attrs, semconv.DBOperationBatchSize(len(queries)))
	}
	if t.cfg.queryText && len(queries) > 0 {
		sqls := make([]string, len(queries))
		for i, q := range queries {
			sqls[i] = q.SQL
		}
		attrs = append(attrs, semconv.DBQueryText(strings.Join(sqls, "; ")))
	}
	attrs = appendTenant(ctx, attrs)
	return t.startDBSpan(ctx, batchSpanKey{}, spanName(op, ci.namespace), attrs)
}

// TraceBatchQuery records a failed query of the batch as an error event.
func (t *Tracer) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if data.Err == nil {
		return
	}
	if span, ok := ctx.Value(batchSpanKey{}).(trace.Span); ok {
		span.RecordError(data.Err, trace.WithAttributes(semconv.DBOperationName(operationName(data.SQL))))
	}
}

// TraceBatchEnd ends the batch span and records the batch's duration.
func (t *Tracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	t.endCall(ctx, conn, func(ci *connInfo) *call { return &ci.batchCall }, data.Err)
	endDBSpan(ctx, batchSpanKey{}, data.Err)
}

// TraceCopyFromStart starts a COPY span.
func (t *Tracer) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	timed := t.opDuration.Enabled(ctx)
	if !timed && !t.wantSpan(ctx) {
		return ctx
	}
	ci := connInfoOf(conn)
	if timed {
		ci.startCall(&ci.copyCall, "COPY")
	}
	if !t.wantSpan(ctx) {
		return ctx
	}
	table := data.TableName.Sanitize()
	attrs := make([]attribute.KeyValue, 0, len(ci.attrs)+3)
	attrs = append(attrs, ci.attrs...)
	attrs = append(attrs, semconv.DBOperationName("COPY"), semconv.DBCollectionName(table))
	attrs = appendTenant(ctx, attrs)
	return t.startDBSpan(ctx, copySpanKey{}, "COPY "+table, attrs)
}

// TraceCopyFromEnd ends the COPY span and records the copy's duration.
func (t *Tracer) TraceCopyFromEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromEndData) {
	t.endCall(ctx, conn, func(ci *connInfo) *call { return &ci.copyCall }, data.Err)
	endDBSpan(ctx, copySpanKey{}, data.Err)
}

// TracePrepareStart starts a span for preparing a statement. pgx prepares
// on a statement-cache miss, inside the query that missed, so this span is
// usually the query span's child.
func (t *Tracer) TracePrepareStart(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareStartData) context.Context {
	if !t.wantSpan(ctx) {
		return ctx
	}
	ci := connInfoOf(conn)
	attrs := make([]attribute.KeyValue, 0, len(ci.attrs)+3)
	attrs = append(attrs, ci.attrs...)
	attrs = append(attrs, semconv.DBOperationName("PREPARE"))
	if t.cfg.queryText {
		attrs = append(attrs, semconv.DBQueryText(data.SQL))
	}
	attrs = appendTenant(ctx, attrs)
	return t.startDBSpan(ctx, prepareSpanKey{}, spanName("PREPARE", ci.namespace), attrs)
}

// TracePrepareEnd ends the prepare span.
func (t *Tracer) TracePrepareEnd(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareEndData) {
	endDBSpan(ctx, prepareSpanKey{}, data.Err)
}

// ConnectSpanName is the name of spans for opening a connection.
const ConnectSpanName = "connect"

// TraceConnectStart starts a span for opening a connection. pgxpool opens
// connections with the context of the Acquire that needed one, so the span
// belongs to that request's trace.
func (t *Tracer) TraceConnectStart(ctx context.Context, data pgx.TraceConnectStartData) context.Context {
	if !t.wantSpan(ctx) {
		return ctx
	}
	ci := newConnInfo(data.ConnConfig)
	attrs := appendTenant(ctx, append([]attribute.KeyValue(nil), ci.attrs...))
	return t.startDBSpan(ctx, connectSpanKey{}, ConnectSpanName, attrs)
}

// TraceConnectEnd ends the connect span and, whether traced or not, stores
// the connection's attributes for its query spans.
func (t *Tracer) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	endDBSpan(ctx, connectSpanKey{}, data.Err)
	if data.Err == nil && data.Conn != nil && t.cfg.querySpans {
		connInfoOf(data.Conn)
	}
}

// startCall starts timing a call on the connection. The shared noConnInfo
// (a hook given no connection) is never written to.
func (ci *connInfo) startCall(c *call, op string) {
	if ci == noConnInfo {
		return
	}
	*c = call{start: time.Now(), op: op}
}

// endCall records db.client.operation.duration for one call on conn, the
// one that which picks out of the connection's state (query, batch or copy),
// if startCall timed it. Attributes are
// the semantic conventions': the connection's (db.system.name, db.namespace,
// server.address, server.port), db.operation.name when the SQL starts with a
// keyword, and on failure error.type and, for a PostgreSQL error,
// db.response.status_code (its SQLSTATE).
func (t *Tracer) endCall(ctx context.Context, conn *pgx.Conn, which func(*connInfo) *call, err error) {
	if conn == nil || conn.PgConn() == nil {
		return
	}
	ci, ok := conn.PgConn().CustomData()[connInfoKey].(*connInfo)
	if !ok {
		return
	}
	c := which(ci)
	if c.start.IsZero() {
		return
	}
	d := time.Since(c.start).Seconds()
	op := c.op
	*c = call{}
	if err == nil {
		opts, ok := ci.okOpts[op]
		if !ok {
			opts = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(ci.opAttrs(op)...))}
			if ci.okOpts == nil {
				ci.okOpts = make(map[string][]metric.RecordOption)
			}
			ci.okOpts[op] = opts
		}
		t.opDuration.Record(ctx, d, opts...)
		return
	}
	attrs := ci.opAttrs(op)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		attrs = append(attrs, semconv.DBResponseStatusCode(pgErr.Code), semconv.ErrorTypeKey.String(pgErr.Code))
	} else {
		attrs = append(attrs, semconv.ErrorType(err))
	}
	t.opDuration.Record(ctx, d, metric.WithAttributes(attrs...))
}

// opAttrs returns a new slice of the connection's attributes and op's.
func (ci *connInfo) opAttrs(op string) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, len(ci.attrs)+3)
	attrs = append(attrs, ci.attrs...)
	if op != "" {
		attrs = append(attrs, semconv.DBOperationName(op))
	}
	return attrs
}

// operationName is the package's operationName, cached per connection. The
// shared noConnInfo has no cache.
func (ci *connInfo) operationName(sql string) string {
	kw := operationKeyword(sql)
	if ci == noConnInfo {
		return strings.ToUpper(kw)
	}
	if op, ok := ci.opNames[kw]; ok {
		return op
	}
	op := strings.ToUpper(kw)
	if ci.opNames == nil {
		ci.opNames = make(map[string]string)
	}
	ci.opNames[strings.Clone(kw)] = op // a substring would keep the whole SQL alive
	return op
}
