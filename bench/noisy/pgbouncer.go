package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// runPgBouncer is the peer users would pick instead of tenantdb: PgBouncer in
// front of the same server, each tenant a database user with its own pool
// capped by max_user_connections, the database capped by max_db_connections.
// Each tenant's application pool may open as many client connections as it
// has requests; PgBouncer queues them. pgxpool talks to it with the simple
// protocol, as transaction pooling in PgBouncer 1.18 requires.
func runPgBouncer(ctx context.Context, env *environment, name string) ([]result, error) {
	const password = "tenant-password"
	admin, err := pgx.Connect(ctx, env.pg.DSN)
	if err != nil {
		return nil, err
	}
	for _, tenant := range []string{"noisy", "quiet"} {
		// A role per tenant, as PgBouncer's per-user caps need.
		_, err := admin.Exec(ctx, fmt.Sprintf(`do $$ begin
			if not exists (select from pg_roles where rolname = '%[1]s') then
				create role %[1]s login password '%[2]s';
			end if; end $$`, tenant, password))
		if err != nil {
			admin.Close(ctx)
			return nil, fmt.Errorf("create role %s: %w", tenant, err)
		}
	}
	admin.Close(ctx)

	w := env.work
	bouncer, err := tenantdbtest.RunPgBouncer(ctx, env.pg,
		tenantdbtest.WithPoolMode(tenantdbtest.PoolModeTransaction),
		tenantdbtest.WithPoolSize(perTenantCap),
		tenantdbtest.WithPgBouncerUser("noisy", password),
		tenantdbtest.WithPgBouncerUser("quiet", password),
		tenantdbtest.WithPgBouncerSetting("max_client_conn", strconv.Itoa(w.noisyN+w.quietN+50)),
		tenantdbtest.WithPgBouncerSetting("min_pool_size", strconv.Itoa(perTenantCap)),
		tenantdbtest.WithPgBouncerSetting("max_user_connections", strconv.Itoa(perTenantCap)),
		tenantdbtest.WithPgBouncerSetting("max_db_connections", strconv.Itoa(sharedConns)),
	)
	if errors.Is(err, tenantdbtest.ErrNoPgBouncer) {
		return nil, skipError{err.Error()}
	}
	if err != nil {
		return nil, err
	}
	defer bouncer.Terminate()

	pools := map[string]*pgxpool.Pool{}
	for tenant, conns := range map[string]int{"noisy": w.noisyN, "quiet": w.quietN} {
		cfg, err := env.pgxConfig(bouncer.DSNFor(tenant, password), int32(conns))
		if err != nil {
			return nil, err
		}
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		defer p.Close()
		if err := warm(ctx, p, w); err != nil {
			return nil, err
		}
		pools[tenant] = p
	}
	if err := waitServerConns(ctx, bouncer); err != nil {
		return nil, err
	}

	rows := env.measure(ctx, name, func(ctx context.Context, tenant string, d time.Duration) error {
		_, err := pools[tenant].Exec(ctx, sleepSQL(tenant, d))
		return err
	})
	hop, err := hopCost(ctx, env.pg.DSN, pools["quiet"])
	if err != nil {
		return nil, err
	}
	progress("%s: one select 1 costs %.3f ms direct and %.3f ms through PgBouncer (median of %d)",
		name, ms(hop.direct), ms(hop.bounced), hop.n)
	rows = append(rows, result{Scenario: name, Tenant: "select-1-direct", P50: ms(hop.direct), Completed: hop.n},
		result{Scenario: name, Tenant: "select-1-pgbouncer", P50: ms(hop.bounced), Completed: hop.n})
	return rows, nil
}

type hop struct {
	direct, bounced time.Duration
	n               int
}

// hopCost measures the extra hop: the median of sequential select 1 direct
// and through PgBouncer, alternating so that both see the same machine.
func hopCost(ctx context.Context, dsn string, bounced *pgxpool.Pool) (hop, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return hop{}, err
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.MaxConns = 1
	direct, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return hop{}, err
	}
	defer direct.Close()
	const n = 500
	var ds, bs []time.Duration
	for range n {
		for _, p := range []*pgxpool.Pool{direct, bounced} {
			t0 := time.Now()
			if _, err := p.Exec(ctx, "select 1"); err != nil {
				return hop{}, err
			}
			if p == direct {
				ds = append(ds, time.Since(t0))
			} else {
				bs = append(bs, time.Since(t0))
			}
		}
	}
	return hop{direct: percentile(ds, 50), bounced: percentile(bs, 50), n: n}, nil
}

// waitServerConns waits until PgBouncer has opened min_pool_size server
// connections for each tenant, so that connecting is not mistaken for
// queueing. It asks PgBouncer's admin console (SHOW POOLS).
func waitServerConns(ctx context.Context, b *tenantdbtest.PgBouncer) error {
	cfg, err := pgx.ParseConfig(b.AdminDSN)
	if err != nil {
		return err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pgbouncer admin console: %w", err)
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		rows, err := conn.Query(ctx, "SHOW POOLS")
		if err != nil {
			return err
		}
		ready := 0
		for rows.Next() {
			row, err := rows.Values()
			if err != nil {
				return err
			}
			cols := map[string]any{}
			for i, fd := range rows.FieldDescriptions() {
				cols[fd.Name] = row[i]
			}
			if cols["user"] != "noisy" && cols["user"] != "quiet" {
				continue
			}
			if n, _ := strconv.Atoi(fmt.Sprint(cols["sv_idle"])); n >= perTenantCap {
				ready++
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if ready == 2 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgbouncer opened no %d server connections per tenant in 30s", perTenantCap)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
