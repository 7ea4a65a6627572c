package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/pool/redislimit"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// config is one way a user can set up a tenantdb.Pool; the checker runs the
// same random workload under each.
type config struct {
	name       string
	scope      tenantdb.Scope
	setting    bool // Session.TenantSetting
	searchPath bool // Session.SearchPath: a schema per tenant
	role       bool // Session.Role: a role per tenant
	database   bool // Config.Database: a database per tenant, MaxConns the budget
	classes    bool // Config.Classes, and ops that name one
	pooler     bool // behind PgBouncer in transaction mode
	adaptive   bool // Config.Adaptive
	cluster    bool // Config.Cluster: the Redis limiter, reached through a proxy that cuts it off
	failClosed bool // the limiter's Mode is FailClosed (else FailOpen, its default)
	proxied    bool // through the checker's TCP proxy, which delays, stalls and cuts
	servers    bool // tenantdb.NewServers over three servers, tenants moved between them (servers.go)
	sharedDB   bool // with servers: every tenant in one database of each server, sharing its connections
	replicas   bool // tenantdb.NewServers over one server and its streaming replica, reads marked ReadOnly (replicas.go)
	failRead   bool // the replica's Unavailable is FailRead (else ReadPrimary, its default)
	holdLimits bool // small IdleInTransactionTimeout and MaxHold, a class Budget, and holds that outlive them (held.go)
}

// configs lists every configuration, in the order -config all runs them.
var configs = []config{
	{name: "session", scope: tenantdb.ScopeSession},
	{name: "session-setting", scope: tenantdb.ScopeSession, setting: true},
	{name: "session-searchpath", scope: tenantdb.ScopeSession, searchPath: true},
	{name: "session-role", scope: tenantdb.ScopeSession, role: true},
	{name: "session-all", scope: tenantdb.ScopeSession, setting: true, searchPath: true, role: true},
	{name: "tx", scope: tenantdb.ScopeTransaction},
	{name: "tx-setting", scope: tenantdb.ScopeTransaction, setting: true},
	{name: "tx-all", scope: tenantdb.ScopeTransaction, setting: true, searchPath: true, role: true},
	{name: "database-session", scope: tenantdb.ScopeSession, database: true, setting: true},
	{name: "database-tx", scope: tenantdb.ScopeTransaction, database: true, setting: true},
	{name: "classes", scope: tenantdb.ScopeSession, setting: true, classes: true},
	{name: "pgbouncer-tx", scope: tenantdb.ScopeTransaction, setting: true, searchPath: true, role: true, pooler: true},
	{name: "session-proxy", scope: tenantdb.ScopeSession, setting: true, proxied: true},
	{name: "tx-proxy", scope: tenantdb.ScopeTransaction, setting: true, searchPath: true, proxied: true},
	{name: "adaptive", scope: tenantdb.ScopeSession, setting: true, adaptive: true},
	{name: "cluster", scope: tenantdb.ScopeSession, setting: true, cluster: true},
	{name: "cluster-closed", scope: tenantdb.ScopeSession, setting: true, cluster: true, failClosed: true},
	{name: "servers", scope: tenantdb.ScopeSession, setting: true, servers: true},
	{name: "servers-tx", scope: tenantdb.ScopeTransaction, setting: true, servers: true},
	{name: "servers-shared", scope: tenantdb.ScopeSession, setting: true, servers: true, sharedDB: true},
	{name: "servers-shared-tx", scope: tenantdb.ScopeTransaction, setting: true, servers: true, sharedDB: true},
	{name: "replicas", scope: tenantdb.ScopeSession, setting: true, replicas: true},
	{name: "replicas-tx", scope: tenantdb.ScopeTransaction, setting: true, searchPath: true, replicas: true, failRead: true},
	{name: "timelimits", scope: tenantdb.ScopeSession, setting: true, classes: true, holdLimits: true},
	{name: "replicas-timelimits", scope: tenantdb.ScopeSession, setting: true, role: true, replicas: true, holdLimits: true},
	{name: "timelimits-tx", scope: tenantdb.ScopeTransaction, setting: true, searchPath: true, role: true, holdLimits: true},
}

func findConfig(name string) (config, bool) {
	for _, c := range configs {
		if c.name == name {
			return c, true
		}
	}
	return config{}, false
}

// The names the checker gives its objects. A tenant's hostile statements
// leave values tagged "evil_<tenant>", so that the invariants can tell whose
// leftover a value is.
const (
	loginRole  = "isoapp"
	loginPass  = "app"
	appName    = "isocheck"
	settingKey = "iso.tenant"
)

func tenantName(i int) string           { return fmt.Sprintf("t%d", i) }
func tag(tenant string) string          { return "evil_" + tenant }
func tenantSchema(tenant string) string { return "iso_" + tenant }
func tenantRole(tenant string) string   { return "iso_role_" + tenant }
func tenantDatabase(tenant string) string {
	return "iso_" + tenant
}

// expected is what a tenant's statement must see in configuration c.
func (c config) expected(e *env, tenant string) probeResult {
	r := probeResult{
		database:   e.templateDB,
		user:       loginRole,
		session:    loginRole,
		setting:    "",
		searchPath: e.defaultPath,
		marker:     "public",
	}
	if c.database {
		r.database = tenantDatabase(tenant)
		r.marker = tenant
	}
	if c.role {
		r.user = tenantRole(tenant)
	}
	if c.setting {
		r.setting = tenant
	}
	if c.searchPath {
		r.searchPath = tenantSchema(tenant) + ",public"
		r.marker = tenant
	}
	return r
}

// classNames are the classes of the classes configuration; "" is the default.
var classNames = []string{"", "batch", "report"}

// newPool builds the Pool of configuration c with maxConns connections (the
// budget with Config.Database); it returns the Pool, the cluster limiter's
// key prefix, and what must be closed after it.
func (c config) newPool(ctx context.Context, e *env, maxConns int) (p *tenantdb.Pool, prefix string, closeAll func(), err error) {
	dsn := e.appDSN
	closeExtra := func() {}
	if c.pooler {
		if !e.havePooler {
			return nil, "", nil, errNoPooler
		}
		// A PgBouncer of the run's own, behind a proxy that lets the run
		// replace it when it dies (bouncer.go).
		f, err := startBouncerFront(ctx, e)
		if err != nil {
			return nil, "", nil, err
		}
		e.bouncer = f
		closeExtra = func() { f.close(); e.bouncer = nil }
		dsn = f.dsn()
	}
	if c.proxied {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, "", nil, err
		}
		u.Host = e.proxy.addr()
		dsn = u.String()
	}
	if c.database {
		// connect_timeout bounds a wait for room in the budget (issue 51, 7).
		dsn = withParam(dsn, "connect_timeout", strconv.Itoa(int(connectTimeout/time.Second)))
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, "", nil, err
	}
	pcfg.MaxConns = int32(maxConns)
	pcfg.ConnConfig.RuntimeParams["application_name"] = appName
	if c.scope == tenantdb.ScopeTransaction {
		pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // as New requires
	}
	cfg := tenantdb.Config{
		Plans: map[string]pool.Plan{"default": {
			MaxConns: max(1, maxConns-1), MaxWaiting: tenantdb.Unbounded,
		}},
		Session: pool.Session{Scope: c.scope},
		Logger:  slog.New(slog.DiscardHandler),
	}
	if c.setting {
		cfg.Session.TenantSetting = settingKey
	}
	if c.searchPath {
		cfg.Session.SearchPath = func(t string) []string { return []string{tenantSchema(t), "public"} }
	}
	if c.role {
		cfg.Session.Role = roleOf
	}
	if c.database {
		cfg.Database = func(t string) (string, error) { return tenantDatabase(t), nil }
	}
	if c.classes {
		cfg.Classes = map[string]pool.Class{
			"batch":  {MaxConns: 1, MaxWaiting: tenantdb.Unbounded},
			"report": {MaxConns: 1, MaxWaiting: tenantdb.Unbounded, MaxShare: 0.5},
		}
	}
	if c.holdLimits {
		// Limits that the workload's own holds outlive (held.go); a class
		// budget small enough to refuse and queue some of its calls.
		plan := cfg.Plans["default"]
		plan.IdleInTransactionTimeout, plan.MaxHold = idleTimeout, maxHold
		cfg.Plans["default"] = plan
		if c.classes {
			b := cfg.Classes["batch"]
			b.Budget = pool.Budget{Rate: 0.5, Burst: 500 * time.Millisecond}
			cfg.Classes["batch"] = b
			r := cfg.Classes["report"]
			r.MaxWaiting, r.Budget = 0, pool.Budget{Rate: 0.2, Burst: 300 * time.Millisecond}
			cfg.Classes["report"] = r
		}
	}
	if c.adaptive {
		cfg.Adaptive = pool.Adaptive{Enabled: true, MinConns: 1, ProbeInterval: 200 * time.Millisecond}
	}
	if c.cluster {
		if e.redisAddr == "" {
			closeExtra()
			return nil, "", nil, errNoRedis
		}
		client := redis.NewClient(&redis.Options{Addr: e.redisProxy.addr(), MaxRetries: -1})
		prefix = fmt.Sprintf("isocheck:%d:", time.Now().UnixNano())
		mode := redislimit.FailOpen
		if c.failClosed {
			mode = redislimit.FailClosed
		}
		lim, err := redislimit.New(redislimit.Config{
			Client: client, Prefix: prefix, Mode: mode,
			LeaseTTL: leaseTTL, RenewEvery: time.Second, OpTimeout: redisOpTimeout, Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			client.Close()
			closeExtra()
			return nil, "", nil, err
		}
		cfg.Cluster = lim
		closeExtra = func() { lim.Close(); client.Close() }
	}
	if c.replicas {
		p, closeReplica, err := newReplicaPool(ctx, e, c, pcfg, cfg)
		if err != nil {
			closeExtra()
			return nil, "", nil, err
		}
		return p, "", func() { p.Close(); closeReplica(); closeExtra() }, nil
	}
	p, err = tenantdb.New(ctx, pcfg, cfg)
	if err != nil {
		closeExtra()
		return nil, "", nil, err
	}
	return p, prefix, func() { p.Close(); closeExtra() }, nil
}

func withParam(dsn, k, v string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// normPath writes a search_path as a comparable list: no quotes, no spaces,
// without the pg_temp that ScopeTransaction puts last.
func normPath(p string) string {
	p = strings.NewReplacer(`"`, "", " ", "").Replace(p)
	return strings.TrimSuffix(p, ",pg_temp")
}
