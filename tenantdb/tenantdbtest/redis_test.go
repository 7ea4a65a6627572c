package tenantdbtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

func TestRedisPingAndKeepsKeyAcrossStopStart(t *testing.T) {
	t.Parallel()
	r := tenantdbtest.StartRedis(t)
	if r.Container == nil || r.Image == "" {
		t.Fatalf("StartRedis started no container: %+v", r)
	}
	addr := r.Addr
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()

	tenantdbtest.EventuallyNoError(t, 30*time.Second, "PING", func(ctx context.Context) error {
		pong, err := rdb.Ping(ctx).Result()
		if err == nil && pong != "PONG" {
			err = errors.New("PING answered " + pong)
		}
		return err
	})
	if err := rdb.Set(t.Context(), "tenantdbtest:key", "kept", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	if err := r.Stop(t.Context()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Errorf("PING succeeded while the server was stopped")
	}
	cancel()
	if err := r.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if r.Addr != addr {
		t.Fatalf("Addr changed across Stop/Start: %s -> %s", addr, r.Addr)
	}

	var v string
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "GET after restart", func(ctx context.Context) (err error) {
		v, err = rdb.Get(ctx, "tenantdbtest:key").Result()
		return err
	})
	if v != "kept" {
		t.Errorf("GET after restart = %q, want %q", v, "kept")
	}
}

func TestRedisArgsAndExistingServer(t *testing.T) {
	r := tenantdbtest.StartRedis(t, tenantdbtest.WithRedisArgs("--maxmemory", "12mb"))
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	var cfg map[string]string
	tenantdbtest.EventuallyNoError(t, 30*time.Second, "CONFIG GET", func(ctx context.Context) (err error) {
		cfg, err = rdb.ConfigGet(ctx, "maxmemory").Result()
		return err
	})
	if cfg["maxmemory"] != "12582912" {
		t.Errorf("maxmemory = %q, want 12582912 (12mb)", cfg["maxmemory"])
	}

	t.Setenv("TENANTDB_REDIS_ADDR", r.Addr)
	existing := tenantdbtest.StartRedis(t)
	if existing.Container != nil || existing.Addr != r.Addr {
		t.Fatalf("with TENANTDB_REDIS_ADDR set: %+v", existing)
	}
	if err := existing.Stop(t.Context()); !errors.Is(err, tenantdbtest.ErrNoContainer) {
		t.Errorf("Stop on an existing server: err = %v, want ErrNoContainer", err)
	}
}
