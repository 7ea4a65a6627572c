package tenantdbtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
	"github.com/testcontainers/testcontainers-go/wait"
)

const (
	redisAddrEnv = "TENANTDB_REDIS_ADDR"
	redisPort    = "6379/tcp"
)

// Redis is a Redis server for tests: a container started by StartRedis or
// RunRedis, or an existing server named by TENANTDB_REDIS_ADDR.
type Redis struct {
	// Addr is the server's host:port, for redis.Options.Addr. The host
	// port is fixed when the container is created, so Addr stays valid
	// across Stop and Start.
	Addr string
	// Image is the image the container runs; empty for an existing server.
	Image string
	// Container is the running container; nil for an existing server.
	Container *tcredis.RedisContainer

	server // Stop, Start, Restart, Pause, Unpause
}

type redisConfig struct {
	image          string
	args           []string
	startupTimeout time.Duration
}

// RedisOption configures StartRedis and RunRedis.
type RedisOption func(*redisConfig)

// WithRedisImage runs image instead of the one chosen from
// TENANTDB_REDIS_IMAGE or the defaults. Like the official redis image it
// must take redis-server options as its command and contain redis-cli.
func WithRedisImage(image string) RedisOption {
	return func(c *redisConfig) { c.image = image }
}

// WithRedisArgs passes options to redis-server, like "--maxmemory", "10mb".
func WithRedisArgs(args ...string) RedisOption {
	return func(c *redisConfig) { c.args = append(c.args, args...) }
}

// WithRedisStartupTimeout bounds how long starting (and each Start after
// Stop) waits for the server to answer PING; the default is one minute.
func WithRedisStartupTimeout(d time.Duration) RedisOption {
	return func(c *redisConfig) { c.startupTimeout = d }
}

// redisService is how StartRedis and RunRedis get a Redis server.
var redisService = service[*Redis, RedisOption]{
	envVar: redisAddrEnv,
	existing: func(addr string) (*Redis, error) {
		return &Redis{Addr: addr, server: newServer("Redis", redisAddrEnv, testcontainers.Container(nil))}, nil
	},
	run:      runRedis,
	describe: func(r *Redis) string { return fmt.Sprintf("Redis (%s) at %s", r.Image, r.Addr) },
}

// StartRedis returns a Redis server for t, started in a container that is
// terminated when t ends, or the server TENANTDB_REDIS_ADDR names (the
// options do not apply to it). It fails t when neither can be had, never
// skips it.
func StartRedis(t testing.TB, opts ...RedisOption) *Redis {
	t.Helper()
	return redisService.start(t, opts)
}

// RunRedis is StartRedis for programs outside tests: ctx governs starting
// the container only. The caller must call Terminate when done; on error no
// container is left running.
func RunRedis(ctx context.Context, opts ...RedisOption) (*Redis, error) {
	return redisService.runForProgram(ctx, opts)
}

func runRedis(ctx context.Context, opts []RedisOption) (*Redis, error) {
	cfg := withOptions(redisConfig{startupTimeout: time.Minute}, opts)
	d, image, err := redisImages.connect(ctx, "Redis", redisAddrEnv, cfg.image)
	if err != nil {
		return nil, err
	}

	ctr, hostPort, err := runOnFreeHostPort(d, func(hostPort int) (*tcredis.RedisContainer, error) {
		customizers := []testcontainers.ContainerCustomizer{
			withHostPort(redisPort, d.bindIP, hostPort),
			// Replaces the module's own wait (port, then the log line),
			// which after a restart would be satisfied by the earlier
			// run's log; redis-cli PING is answered PONG only once the
			// data set is loaded.
			testcontainers.WithWaitStrategyAndDeadline(cfg.startupTimeout,
				wait.ForLog("Ready to accept connections").WithStartupTimeout(cfg.startupTimeout),
				wait.ForListeningPort(redisPort).WithStartupTimeout(cfg.startupTimeout),
				wait.ForExec([]string{"redis-cli", "-h", "127.0.0.1", "-p", "6379", "ping"}).
					WithResponseMatcher(func(body io.Reader) bool {
						b, _ := io.ReadAll(body)
						return strings.Contains(string(b), "PONG")
					}).
					WithStartupTimeout(cfg.startupTimeout),
			),
		}
		if len(cfg.args) > 0 {
			// The image's command is "redis-server"; both images take
			// options alone as "redis-server <options>".
			customizers = append(customizers, testcontainers.WithCmd(append([]string{"redis-server"}, cfg.args...)...))
		}
		return tcredis.Run(ctx, image, customizers...)
	})
	r := &Redis{Image: image, Container: ctr, server: newServer("Redis", redisAddrEnv, ctr)}
	if err != nil {
		return r, redisImages.startError("Redis", image, err)
	}
	if mapped, err := mappedHostPort(ctx, ctr, redisPort); err == nil {
		hostPort = mapped
	}
	r.Addr = net.JoinHostPort(d.host, strconv.Itoa(hostPort))
	return r, nil
}

// Terminate stops and removes the container; ctx governs the Docker
// requests. It does nothing for an existing server, and only the first call
// does anything. StartRedis arranges it through t.Cleanup; after RunRedis
// the caller must call it.
func (r *Redis) Terminate(ctx context.Context) error { return terminate(ctx, r) }
