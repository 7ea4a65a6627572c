package tenantdbtest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

// clusterNodes is how many masters StartRedisCluster starts.
const clusterNodes = 3

// RedisCluster is a Redis Cluster of three masters (no replicas) for tests,
// started by StartRedisCluster or RunRedisCluster: three redis-server
// processes in one container on the host's network, on ports picked free,
// each announcing 127.0.0.1 and its port, so that the addresses the nodes
// give out in CLUSTER SLOTS and in MOVED/ASK redirections are the ones a
// client on this host reaches.
type RedisCluster struct {
	// Addrs are the masters' host:port, for redis.ClusterOptions.Addrs.
	Addrs []string
	// Container runs the three nodes.
	Container testcontainers.Container

	term terminator
}

// StartRedisCluster returns a Redis Cluster for t, terminated when t ends.
// It needs a local Docker daemon (the nodes run on the host's network) and
// fails t otherwise, never skips it. The options of StartRedis that apply
// are the image and the startup timeout.
func StartRedisCluster(t testing.TB, opts ...RedisOption) *RedisCluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := RunRedisCluster(ctx, opts...)
	if c != nil && c.Container != nil {
		testcontainers.CleanupContainer(t, c.Container)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tenantdbtest: Redis Cluster at %v", c.Addrs)
	return c
}

// RunRedisCluster starts a Redis Cluster; ctx governs the start. The
// caller must call Terminate; on error no container is left running.
func RunRedisCluster(ctx context.Context, opts ...RedisOption) (*RedisCluster, error) {
	cfg, image, err := hostRedisImage(ctx, "a Redis Cluster", opts)
	if err != nil {
		return nil, err
	}
	ports, err := clusterPorts()
	if err != nil {
		return nil, err
	}
	var script strings.Builder
	script.WriteString("set -e\ncd /data\n")
	var addrs []string
	for _, p := range ports {
		fmt.Fprintf(&script, "redis-server --port %d --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes-%d.conf "+
			"--cluster-node-timeout 2000 --cluster-announce-ip 127.0.0.1 --save '' --appendonly no "+
			"--daemonize yes --logfile /data/%d.log --dir /data\n", p, p, p)
		addrs = append(addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	}
	for _, p := range ports {
		fmt.Fprintf(&script, "until redis-cli -p %d ping >/dev/null 2>&1; do sleep 0.05; done\n", p)
	}
	fmt.Fprintf(&script, "redis-cli --cluster create %s --cluster-yes >/data/create.log 2>&1\n", strings.Join(addrs, " "))
	for _, p := range ports {
		fmt.Fprintf(&script, "until redis-cli -p %d cluster info | grep -q cluster_state:ok; do sleep 0.05; done\n", p)
	}
	script.WriteString("echo 'tenantdbtest: cluster ready'\nexec sleep infinity\n")

	ctr, err := runHostRedis(ctx, cfg, image, "a Redis Cluster", script.String(), "tenantdbtest: cluster ready")
	if err != nil {
		return nil, err
	}
	return &RedisCluster{Container: ctr, Addrs: addrs}, nil
}

// clusterPorts picks a port per node such that the port and its cluster bus
// port (port+10000) are both free now.
func clusterPorts() ([]int, error) {
	var ports []int
	for len(ports) < clusterNodes {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("tenantdbtest: pick a free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		if p+10000 > 65535 {
			_ = l.Close()
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+10000)))
		if err != nil {
			_ = l.Close()
			continue
		}
		defer l.Close()
		defer bus.Close()
		ports = append(ports, p)
	}
	return ports, nil
}

// Terminate stops and removes the container; only the first call does
// anything.
func (c *RedisCluster) Terminate(ctx context.Context) error {
	if c == nil || c.Container == nil {
		return nil
	}
	return c.term.do(ctx, c.Container, "Redis Cluster")
}
