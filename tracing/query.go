package tracing

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
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
		if len(id) > maxTenantAttrLen {
			id = id[:maxTenantAttrLen]
		}
		attrs = append(attrs, TenantKey.String(id))
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

// TraceQueryStart starts a query span (Exec, Query, QueryRow).
func (t *Tracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !t.wantSpan(ctx) {
		return ctx
	}
	ci := connInfoOf(conn)
	op := operationName(data.SQL)
	attrs := make([]attribute.KeyValue, 0, len(ci.attrs)+3)
	attrs = append(attrs, ci.attrs...)
	if op != "" {
		attrs = append(attrs, semconv.DBOperationName(op))
	}
	if t.cfg.queryText {
		attrs = append(attrs, semconv.DBQueryText(data.SQL))
	}
	attrs = appendTenant(ctx, attrs)
	return t.startDBSpan(ctx, querySpanKey{}, spanName(op, ci.namespace), attrs)
}

// TraceQueryEnd ends the query span.
func (t *Tracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	span, ok := ctx.Value(querySpanKey{}).(trace.Span)
	if !ok {
		return // nothing to build attributes for: the unsampled path allocates nothing
	}
	if data.Err == nil && data.CommandTag.Select() {
		span.SetAttributes(semconv.DBResponseReturnedRows(int(data.CommandTag.RowsAffected())))
	}
	finishSpan(span, data.Err)
}

// TraceBatchStart starts a batch span. Its operation is "BATCH" followed by
// the queries' operation when they all have the same one, and its query
// text the queries joined by "; ", as the semantic conventions say.
func (t *Tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if !t.wantSpan(ctx) {
		return ctx
	}
	ci := connInfoOf(conn)
	var queries []*pgx.QueuedQuery
	if data.Batch != nil {
		queries = data.Batch.QueuedQueries
	}
	op := "BATCH"
	for i, q := range queries {
		qop := operationName(q.SQL)
		if i == 0 {
			op = "BATCH " + qop
		} else if "BATCH "+qop != op {
			op = "BATCH"
			break
		}
	}
	op = strings.TrimSpace(op)
	attrs := make([]attribute.KeyValue, 0, len(ci.attrs)+4)
	attrs = append(attrs, ci.attrs...)
	attrs = append(attrs, semconv.DBOperationName(op))
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

// TraceBatchEnd ends the batch span.
func (t *Tracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	endDBSpan(ctx, batchSpanKey{}, data.Err)
}

// TraceCopyFromStart starts a COPY span.
func (t *Tracer) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	if !t.wantSpan(ctx) {
		return ctx
	}
	ci := connInfoOf(conn)
	table := data.TableName.Sanitize()
	attrs := make([]attribute.KeyValue, 0, len(ci.attrs)+3)
	attrs = append(attrs, ci.attrs...)
	attrs = append(attrs, semconv.DBOperationName("COPY"), semconv.DBCollectionName(table))
	attrs = appendTenant(ctx, attrs)
	return t.startDBSpan(ctx, copySpanKey{}, "COPY "+table, attrs)
}

// TraceCopyFromEnd ends the COPY span.
func (t *Tracer) TraceCopyFromEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromEndData) {
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
