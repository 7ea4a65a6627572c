// Package tracing is tenantdb's OpenTelemetry instrumentation: spans for
// admissions and queries, per-tenant and connection-pool metrics, and leak
// detection. Like otelpgx and otelhttp it depends on the OpenTelemetry API
// only: the program brings the providers, otel's global ones by default (as
// with otelpgx and otelhttp), or others given with [WithTracerProvider] and
// [WithMeterProvider].
// Package [github.com/tenantdb/tenantdb/tracing/otelsetup] sets them up:
// OTLP export of spans and metrics, or metrics for Prometheus to scrape.
//
// One [Tracer] serves one pool. Give it to tenantdb as Config.Tracer: it
// observes every admission through the pool's hooks, and tenantdb chains it
// after any pgx tracer of your own, so query spans come from it too.
// Then register the pool's observable metrics with [Tracer.ObservePool]:
//
//	tr := tracing.New(tracing.WithTracerProvider(tp), tracing.WithMeterProvider(mp),
//		tracing.WithPoolName("orders"))
//	p, err := tenantdb.New(ctx, pgxCfg, tenantdb.Config{Tracer: tr, ...})
//	...
//	stop, err := tr.ObservePool(p)
//	defer stop()
//
// # Spans
//
// An admission span, "tenantdb.acquire", covers the wait for the tenant's
// own cap and for global capacity. It carries the tenant, its plan, its cap
// and effective limit (lower than the cap only under adaptive limits), what it
// had in use and its place in line on arrival, both waits in seconds and the
// outcome (acquired, rejected, timed_out, cancelled, failed);
// every outcome but acquired sets the span status to Error.
//
// Query, batch, copy, prepare and connect spans follow the OpenTelemetry
// database semantic conventions (db.system.name, db.namespace,
// db.operation.name, db.query.text, server.address, server.port) and carry
// the tenant of the context ([TenantKey]).
//
// Like otelhttp and otelpgx, the Tracer creates no span when the context has
// no recording span: a request that was not sampled costs no span work. Use
// [WithRootSpans] to start traces from the database layer itself.
//
// # Metrics
//
// The connection-pool metrics of the semantic conventions
// (db.client.connection.count, .max, .pending_requests, .timeouts,
// .wait_time, .use_time, all with db.client.connection.pool.name) and
// per-tenant ones under tenantdb.tenant.connection.* (in use, waiting, cap
// (max), effective limit (effective_max), rejections, wait and use time,
// leaks). Durations are in seconds.
// Every query, batch and copy is measured in db.client.operation.duration,
// the stable semantic-convention histogram, whether or not it is traced.
// How tenants are labelled is a [Cardinality]: by tenant, by plan, or the n
// busiest tenants plus "other"; in every mode the number of series has a
// bound that no flood of tenant IDs can push past.
//
// The directory prometheus/ beside this package ships Prometheus recording
// rules and alerts and a Grafana dashboard over these metrics, tested
// against a real Prometheus.
//
// # Leak detection
//
// [WithLeakDetection] reports, as HikariCP does, permits held longer than a
// threshold: a log/slog warning with the tenant, the hold time and the stack
// that acquired it, an event on the acquiring span and a count; and a second
// log line when the permit comes back. Without it, nothing is captured.
package tracing
