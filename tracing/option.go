package tracing

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Option configures a Tracer. Options are applied in order by New.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config is what the options set; New reads it once.
type config struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	poolName       string
	attrs          []attribute.KeyValue
	rootSpans      bool
	queryText      bool
	querySpans     bool
	cardinality    Cardinality
	leakThreshold  time.Duration
	logger         *slog.Logger
}

func newConfig(opts []Option) config {
	c := config{
		poolName:    defaultPoolName,
		queryText:   true,
		querySpans:  true,
		cardinality: TopTenants(10, 100),
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// defaultPoolName is db.client.connection.pool.name unless WithPoolName
// says otherwise.
const defaultPoolName = "tenantdb"

// WithTracerProvider sets the provider of the Tracer's spans. Default:
// otel's global one (otel.GetTracerProvider()).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tracerProvider = tp })
}

// WithMeterProvider sets the provider of the Tracer's metrics. Default:
// otel's global one (otel.GetMeterProvider()).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.meterProvider = mp })
}

// WithPoolName sets db.client.connection.pool.name on every metric, and on
// spans. The semantic conventions ask for a name unique within the
// application: give each pool (and so each Tracer) its own when a service
// has several. Default "tenantdb".
func WithPoolName(name string) Option {
	return optionFunc(func(c *config) {
		if name != "" {
			c.poolName = name
		}
	})
}

// WithAttributes adds attributes to every span the Tracer starts.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) { c.attrs = append(c.attrs, attrs...) })
}

// WithRootSpans makes the Tracer start spans even when the context has no
// recording span: they then begin traces of their own, subject to the
// provider's sampler. By default, as with otelhttp and otelpgx, work done
// for a request that is not traced (or not sampled) creates no span, which
// keeps the cost of the unsampled path near zero.
func WithRootSpans() Option {
	return optionFunc(func(c *config) { c.rootSpans = true })
}

// WithoutQueryText leaves db.query.text off query spans, for SQL that may
// carry data that must not leave the service. The operation name (the first
// keyword of the SQL) is still recorded. Arguments are never recorded.
func WithoutQueryText() Option {
	return optionFunc(func(c *config) { c.queryText = false })
}

// WithoutQuerySpans turns off the spans made through pgx's tracer
// interfaces (query, batch, copy, prepare, connect), for services that
// already trace pgx with otelpgx or a tracer of their own: tenantdb chains
// both, and two spans per query would be noise. Admission spans and metrics
// are kept.
func WithoutQuerySpans() Option {
	return optionFunc(func(c *config) { c.querySpans = false })
}

// WithCardinality chooses how per-tenant metrics label tenants. Default
// TopTenants(10, 100).
func WithCardinality(card Cardinality) Option {
	return optionFunc(func(c *config) { c.cardinality = card })
}

// WithLeakDetection reports permits held longer than threshold, as
// HikariCP's leakDetectionThreshold does: a warning logged with the tenant,
// the hold time and the stack that acquired the permit; an event on the
// span that acquired it; a count in tenantdb.tenant.connection.leaks; and,
// when the permit comes back, a second log line. The stack is captured on
// every acquire while detection is on (about a microsecond), and not at all
// otherwise. Default 0: off. A threshold well above the longest legitimate
// transaction avoids false alarms.
func WithLeakDetection(threshold time.Duration) Option {
	return optionFunc(func(c *config) { c.leakThreshold = max(threshold, 0) })
}

// WithLogger sets the logger of leak reports and of errors creating the
// instruments. Default: slog.Default() at the time of the report.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}
