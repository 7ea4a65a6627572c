package tracing

import (
	"errors"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/semconv/v1.43.0/dbconv"
)

// instruments are the Tracer's metric instruments, created once by New.
type instruments struct {
	// The semantic conventions' connection-pool instruments.
	connCount    metric.Int64ObservableUpDownCounter
	connMax      metric.Int64ObservableUpDownCounter
	connPending  metric.Int64ObservableUpDownCounter
	connTimeouts metric.Int64Counter
	connWait     metric.Float64Histogram
	connUse      metric.Float64Histogram
	opDuration   metric.Float64Histogram // db.client.operation.duration

	// Per-tenant instruments, labelled by labels.
	tenantCount        metric.Int64ObservableUpDownCounter
	tenantPending      metric.Int64ObservableUpDownCounter
	tenantMax          metric.Int64ObservableUpDownCounter
	tenantEffectiveMax metric.Int64ObservableUpDownCounter
	tenantRejections   metric.Int64Counter
	tenantWait         metric.Float64Histogram
	tenantUse          metric.Float64Histogram
	tenantLeaks        metric.Int64Counter
	tenantTimeouts     metric.Int64Counter
	tenantBudgetUsed   metric.Float64Counter
	tenantBudgetLeft   metric.Float64ObservableGauge

	// Per-class instruments (pool.Config.Classes), observed from the
	// Gate's stats: no work on the admission path, and at most
	// pool.MaxClasses+1 class labels.
	classCount      metric.Int64ObservableUpDownCounter
	classPending    metric.Int64ObservableUpDownCounter
	classMax        metric.Int64ObservableUpDownCounter
	classAdmissions metric.Int64ObservableCounter
	classWait       metric.Float64ObservableCounter
	classUse        metric.Float64ObservableCounter

	// Database-per-tenant instruments (tenantdb.Config.Database), observed
	// from the Pool's stats; the count only for databases with a
	// connection open, at most the budget of them.
	dbCount    metric.Int64ObservableUpDownCounter
	dbOpens    metric.Int64ObservableCounter
	dbCloses   metric.Int64ObservableCounter
	dbOpenTime metric.Float64ObservableCounter

	// Per-server instruments (tenantdb.NewServers), observed from the
	// Pool's stats, one series per server.
	srvCount metric.Int64ObservableUpDownCounter
	srvMax   metric.Int64ObservableUpDownCounter
	srvDown  metric.Int64ObservableUpDownCounter
	// A replica's lag (tenantdb.WithReplicas), one series per replica,
	// named as the server metrics' replica series are.
	replicaLag metric.Float64ObservableGauge
}

// durationBuckets are the explicit histogram boundaries, in seconds, that the
// semantic conventions advise for database durations; the SDK's default
// boundaries are meant for milliseconds.
var durationBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10}

// create makes every instrument. The semantic-convention ones come from
// dbconv, so that their names, units and descriptions are the spec's. An
// instrument that fails is left a no-op and its error returned with the others.
func (in *instruments) create(m metric.Meter) error {
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	buckets := metric.WithExplicitBucketBoundaries(durationBuckets...)

	count, err := dbconv.NewClientConnectionCountObservable(m)
	check(err)
	in.connCount = count.Inst()
	connMax, err := dbconv.NewClientConnectionMaxObservable(m)
	check(err)
	in.connMax = connMax.Inst()
	pending, err := dbconv.NewClientConnectionPendingRequestsObservable(m)
	check(err)
	in.connPending = pending.Inst()
	timeouts, err := dbconv.NewClientConnectionTimeouts(m)
	check(err)
	in.connTimeouts = timeouts.Inst()
	wait, err := dbconv.NewClientConnectionWaitTime(m, buckets)
	check(err)
	in.connWait = wait.Inst()
	use, err := dbconv.NewClientConnectionUseTime(m, buckets)
	check(err)
	in.connUse = use.Inst()
	opDuration, err := dbconv.NewClientOperationDuration(m, buckets)
	check(err)
	in.opDuration = opDuration.Inst()

	in.tenantCount, err = m.Int64ObservableUpDownCounter("tenantdb.tenant.connection.count",
		metric.WithUnit("{connection}"),
		metric.WithDescription("Connections a tenant holds: with its limit, the sign of a tenant pinned at its cap."))
	check(err)
	in.tenantPending, err = m.Int64ObservableUpDownCounter("tenantdb.tenant.connection.pending_requests",
		metric.WithUnit("{request}"),
		metric.WithDescription("A tenant's requests waiting for its own cap or for a shared connection."))
	check(err)
	in.tenantMax, err = m.Int64ObservableUpDownCounter("tenantdb.tenant.connection.max",
		metric.WithUnit("{connection}"),
		metric.WithDescription("A tenant's cap on connections; reported for tenant labels only."))
	check(err)
	in.tenantEffectiveMax, err = m.Int64ObservableUpDownCounter("tenantdb.tenant.connection.effective_max",
		metric.WithUnit("{connection}"),
		metric.WithDescription("A tenant's effective limit: its cap, or with adaptive limits what it may hold now; "+
			"reported for tenant labels only."))
	check(err)
	in.tenantRejections, err = m.Int64Counter("tenantdb.tenant.connection.rejections",
		metric.WithUnit("{request}"),
		metric.WithDescription("Requests refused for the tenant: at once (outcome rejected) or after waiting its plan's "+
			"MaxWait or the caller's deadline (timed_out), by cause: cap, budget, deadline."))
	check(err)
	in.tenantTimeouts, err = m.Int64Counter("tenantdb.tenant.timeouts",
		metric.WithUnit("{timeout}"),
		metric.WithDescription("A tenant's work ended by one of its plan's time limits, by limit: statement_timeout, "+
			"idle_in_transaction, max_hold."))
	check(err)
	in.tenantBudgetUsed, err = m.Float64Counter("tenantdb.tenant.budget.used",
		metric.WithUnit("s"),
		metric.WithDescription("Connection-time a tenant held under its plan's Budget, charged at each release."))
	check(err)
	in.tenantBudgetLeft, err = m.Float64ObservableGauge("tenantdb.tenant.budget.left",
		metric.WithUnit("s"),
		metric.WithDescription("What is left of a tenant's connection-time budget for its next request, negative in debt; "+
			"reported for tenant labels of budgeted plans only."))
	check(err)
	in.tenantWait, err = m.Float64Histogram("tenantdb.tenant.connection.wait_time",
		metric.WithUnit("s"), buckets,
		metric.WithDescription("Time a tenant's requests waited for admission, by outcome."))
	check(err)
	in.tenantUse, err = m.Float64Histogram("tenantdb.tenant.connection.use_time",
		metric.WithUnit("s"), buckets,
		metric.WithDescription("Time a tenant held a connection, from admission to release."))
	check(err)
	in.tenantLeaks, err = m.Int64Counter("tenantdb.tenant.connection.leaks",
		metric.WithUnit("{connection}"),
		metric.WithDescription("Connections held past the leak-detection threshold."))
	check(err)
	in.classCount, err = m.Int64ObservableUpDownCounter("tenantdb.class.connection.count",
		metric.WithUnit("{connection}"),
		metric.WithDescription("Connections a workload class holds, all tenants together."))
	check(err)
	in.classPending, err = m.Int64ObservableUpDownCounter("tenantdb.class.connection.pending_requests",
		metric.WithUnit("{request}"),
		metric.WithDescription("A class's requests waiting for a tenant slot or a shared connection."))
	check(err)
	in.classMax, err = m.Int64ObservableUpDownCounter("tenantdb.class.connection.max",
		metric.WithUnit("{connection}"),
		metric.WithDescription("A class's share of the shared pool (Class.MaxShare of MaxConns)."))
	check(err)
	in.classAdmissions, err = m.Int64ObservableCounter("tenantdb.class.connection.admissions",
		metric.WithUnit("{request}"),
		metric.WithDescription("A class's admissions by outcome: acquired, rejected, timed_out, cancelled."))
	check(err)
	in.classWait, err = m.Float64ObservableCounter("tenantdb.class.connection.wait_time",
		metric.WithUnit("s"),
		metric.WithDescription("Total time a class's requests waited for admission."))
	check(err)
	in.classUse, err = m.Float64ObservableCounter("tenantdb.class.connection.use_time",
		metric.WithUnit("s"),
		metric.WithDescription("Total time a class held connections (estimated from a sample where not timed)."))
	check(err)
	in.dbCount, err = m.Int64ObservableUpDownCounter("tenantdb.database.connection.count",
		metric.WithUnit("{connection}"),
		metric.WithDescription("A tenant database's connections by state (used, idle), for the databases with one open: "+
			"at most the budget of them."))
	check(err)
	in.dbOpens, err = m.Int64ObservableCounter("tenantdb.database.connection.opens",
		metric.WithUnit("{connection}"),
		metric.WithDescription("Connections opened across the tenant databases: beside the calls, the churn of "+
			"moving connections between databases."))
	check(err)
	in.srvCount, err = m.Int64ObservableUpDownCounter("tenantdb.server.connection.count",
		metric.WithUnit("{connection}"),
		metric.WithDescription("A server's connections open or opening, across its databases (tenantdb.NewServers): "+
			"at most its budget."))
	check(err)
	in.srvMax, err = m.Int64ObservableUpDownCounter("tenantdb.server.connection.max",
		metric.WithUnit("{connection}"),
		metric.WithDescription("A server's budget of connections (tenantdb.NewServers)."))
	check(err)
	in.srvDown, err = m.Int64ObservableUpDownCounter("tenantdb.server.down",
		metric.WithUnit("1"),
		metric.WithDescription("1 while a server is known down, its tenants' calls failing at once (tenantdb.ErrServerDown); else 0."))
	check(err)
	in.replicaLag, err = m.Float64ObservableGauge("tenantdb.replica.lag",
		metric.WithUnit("s"),
		metric.WithDescription("How far behind its primary a read replica was at its last probes (tenantdb.WithReplicas), "+
			"to within its ProbeEvery; not reported before it was first seen caught up."))
	check(err)
	in.dbCloses, err = m.Int64ObservableCounter("tenantdb.database.connection.closes",
		metric.WithUnit("{connection}"),
		metric.WithDescription("Connections closed across the tenant databases."))
	check(err)
	in.dbOpenTime, err = m.Float64ObservableCounter("tenantdb.database.connection.open_time",
		metric.WithUnit("s"),
		metric.WithDescription("Total time of those opens, from asking the budget for room to the connection being ready."))
	check(err)
	return errors.Join(errs...)
}
