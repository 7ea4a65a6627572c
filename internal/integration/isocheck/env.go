package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

var (
	errNoPooler = errors.New("isocheck: pgbouncer is not installed")
	errNoRedis  = errors.New("isocheck: no redis")
)

// env is what the checker starts once: PostgreSQL with the tenants' roles,
// schemas and databases, PgBouncer and Redis where they can be had.
type env struct {
	pg          *tenantdbtest.Postgres
	bouncer     *bouncerFront // the pooler run's, while it runs
	havePooler  bool
	redis       *tenantdbtest.Redis
	redisAddr   string
	admin       *pgx.Conn // superuser, in the template database
	appDSN      string    // the login role of the pools
	templateDB  string
	defaultPath string // the login role's default search_path, normalized
	proxy       *proxy
	redisProxy  *proxy // between the cluster limiter and Redis, which it cuts off (redisfault.go)
	tenants     []string
	srv         *srvEnv     // the servers configuration's, once it ran (servers.go)
	replica     *replicaEnv // the replicas configurations', once one ran (replicas.go)
	stopped     []func()
}

// numTenants is how many tenants share the few connections.
const numTenants = 4

func startEnv(ctx context.Context, needPooler, needRedis bool, logf func(string, ...any)) (*env, error) {
	e := &env{}
	for i := range numTenants {
		e.tenants = append(e.tenants, tenantName(i))
	}
	pg, err := tenantdbtest.RunPostgres(ctx, tenantdbtest.WithMaxConnections(100))
	if err != nil {
		return nil, err
	}
	e.pg = pg
	e.stopped = append(e.stopped, func() { pg.Terminate(context.Background()) })
	e.templateDB = pg.Database
	admin, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		e.close()
		return nil, err
	}
	e.admin = admin
	if err := e.setup(ctx); err != nil {
		e.close()
		return nil, fmt.Errorf("isocheck: setup: %w", err)
	}
	px, err := startProxy(pg.Addr, 1)
	if err != nil {
		e.close()
		return nil, err
	}
	e.proxy = px
	e.stopped = append(e.stopped, px.close)
	u, _ := url.Parse(pg.DSN)
	u.User = url.UserPassword(loginRole, loginPass)
	e.appDSN = u.String()
	if needPooler {
		b, err := startBouncer(ctx, e)
		switch {
		case errors.Is(err, tenantdbtest.ErrNoPgBouncer):
			logf("pgbouncer is not installed: the pooler configurations are skipped")
		case err != nil:
			e.close()
			return nil, err
		default:
			b.Terminate()
			e.havePooler = true
		}
	}
	if needRedis {
		r, err := tenantdbtest.RunRedis(ctx)
		if err != nil {
			logf("redis could not be started (%v): the cluster configuration is skipped", err)
		} else {
			e.redis = r
			e.redisAddr = r.Addr
			e.stopped = append(e.stopped, func() { r.Terminate(context.Background()) })
			px, err := startProxy(r.Addr, 2)
			if err != nil {
				e.close()
				return nil, err
			}
			e.redisProxy = px
			e.stopped = append(e.stopped, px.close)
		}
	}
	return e, nil
}

// startBouncer runs PgBouncer in transaction mode in front of e's server,
// with 3 server connections.
func startBouncer(ctx context.Context, e *env) (*tenantdbtest.PgBouncer, error) {
	return tenantdbtest.RunPgBouncer(ctx, e.pg,
		tenantdbtest.WithPoolMode(tenantdbtest.PoolModeTransaction),
		tenantdbtest.WithPgBouncerUser(loginRole, loginPass),
		tenantdbtest.WithPoolSize(3))
}

func (e *env) close() {
	if e.admin != nil {
		e.admin.Close(context.Background())
	}
	for i := len(e.stopped) - 1; i >= 0; i-- {
		e.stopped[i]()
	}
}

// rlsSetup is, in every database the probe reads, a table of one row per
// tenant under row-level security: a tenant sees only the row its setting
// names (the probe's rls column).
var rlsSetup = fmt.Sprintf(`create table rls_rows (tenant text);
insert into rls_rows select 't' || i from generate_series(0, %d) i;
alter table rls_rows enable row level security;
create policy own on rls_rows using (tenant = current_setting('iso.tenant', true));
grant select on rls_rows to public;
`, numTenants-1)

// setup creates the login role, and per tenant a role, an "evil" role its
// hostile statements switch to, a schema and a database, each with a marker
// table holding only that tenant's row (the template database's public one
// holds "public").
func (e *env) setup(ctx context.Context) error {
	var b strings.Builder
	fmt.Fprintf(&b, `create role %s login password '%s' nosuperuser nobypassrls nocreaterole;
create table marker (tenant text);
insert into marker values ('public');
create table items (tenant text, db text default current_database(), usr text default current_user, n int);
grant select on marker to public;
grant select, insert on items to public;
%s`, loginRole, loginPass, rlsSetup)
	for _, t := range e.tenants {
		fmt.Fprintf(&b, `create role %[1]s nologin;
create role iso_%[2]s nologin;
grant %[1]s to %[3]s;
grant iso_%[2]s to %[3]s;
grant iso_%[2]s to %[1]s;
create schema %[4]s;
create table %[4]s.marker (tenant text);
insert into %[4]s.marker values ('%[5]s');
grant usage on schema %[4]s to public;
grant select on %[4]s.marker to public;
`, tenantRole(t), tag(t), loginRole, tenantSchema(t), t)
	}
	if _, err := e.admin.Exec(ctx, b.String()); err != nil {
		return err
	}
	for _, t := range e.tenants {
		// The tenant's database is a copy of a template of its own, from
		// which dbfault.go creates it again after dropping it.
		db := templateDatabase(t)
		if _, err := e.admin.Exec(ctx, "create database "+db); err != nil {
			return err
		}
		cfg, _ := pgx.ParseConfig(e.pg.DSN)
		cfg.Database = db
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return err
		}
		_, err = c.Exec(ctx, fmt.Sprintf(`create table marker (tenant text);
insert into marker values ('%s');
create table items (tenant text, db text default current_database(), usr text default current_user, n int);
grant select on marker to public;
grant select, insert on items to public;
%s`, t, rlsSetup))
		c.Close(ctx)
		if err != nil {
			return err
		}
		if _, err := e.admin.Exec(ctx, "create database "+tenantDatabase(t)+" template "+db); err != nil {
			return err
		}
	}
	var path string
	if err := e.admin.QueryRow(ctx, "select reset_val from pg_settings where name = 'search_path'").Scan(&path); err != nil {
		return err
	}
	e.defaultPath = normPath(path)
	return nil
}

// clean ends every backend of the login role and undoes what a hostile ALTER
// ROLE left, between runs, so that each run starts from the same server.
func (e *env) clean(ctx context.Context) error {
	var b strings.Builder
	fmt.Fprintf(&b, "select pg_terminate_backend(pid) from pg_stat_activity where usename = '%s';\n", loginRole)
	roles := []string{loginRole}
	for _, t := range e.tenants {
		roles = append(roles, tenantRole(t), "iso_"+tag(t))
	}
	dbs := []string{e.templateDB}
	for _, t := range e.tenants {
		dbs = append(dbs, tenantDatabase(t))
	}
	for _, r := range roles {
		fmt.Fprintf(&b, "alter role %s reset all;\n", r)
		for _, d := range dbs {
			fmt.Fprintf(&b, "alter role %s in database %s reset all;\n", r, pgx.Identifier{d}.Sanitize())
		}
	}
	_, err := e.admin.Exec(ctx, b.String())
	return err
}
