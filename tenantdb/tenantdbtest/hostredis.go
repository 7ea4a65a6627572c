package tenantdbtest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// hostRedisTimeout bounds StartRedisCluster and StartRedisSentinel.
const hostRedisTimeout = 3 * time.Minute

// hostRedisReady is what runHostRedis's script prints once the servers are
// up.
const hostRedisReady = "tenantdbtest: host Redis ready"

// runHostRedis starts a set-up of several Redis servers in one container on
// the Docker host's network (a Redis Cluster, Sentinel), so that their
// addresses are the ones the tests dial, as MOVED answers and sentinels
// announce them. It picks the ports with pick, runs the sh script that
// script writes for them in /data, and waits until the script is done. what
// names the set-up in errors; ctx governs the start. On error no container
// is left running.
func runHostRedis(ctx context.Context, what string, opts []RedisOption, pick func() ([]int, error),
	script func(w *strings.Builder, ports []int)) (testcontainers.Container, []int, error) {
	cfg := withOptions(redisConfig{startupTimeout: time.Minute}, opts)
	d, image, err := redisImages.connect(ctx, what, redisAddrEnv, cfg.image)
	if err != nil {
		return nil, nil, err
	}
	if d.host != "127.0.0.1" && d.host != "localhost" {
		return nil, nil, fmt.Errorf("tenantdbtest: %s needs a local Docker daemon (its servers use the host's network); Docker is at %s", what, d.host)
	}
	ports, err := pick()
	if err != nil {
		return nil, nil, err
	}
	var sh strings.Builder
	sh.WriteString("set -e\ncd /data\n")
	script(&sh, ports)
	fmt.Fprintf(&sh, "echo '%s'\nexec sleep infinity\n", hostRedisReady)
	ctr, err := testcontainers.Run(ctx, image,
		testcontainers.WithEntrypoint("sh", "-c", sh.String()),
		testcontainers.WithCmd(),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
		testcontainers.WithWaitStrategyAndDeadline(cfg.startupTimeout, wait.ForLog(hostRedisReady)),
	)
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return nil, nil, redisImages.startError(what, image, err)
	}
	return ctr, ports, nil
}

// loopback is host:port of port on 127.0.0.1, where runHostRedis's servers
// listen.
func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
