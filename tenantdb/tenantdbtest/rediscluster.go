package tenantdbtest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

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

	base
}

// StartRedisCluster returns a Redis Cluster for t, terminated when t ends.
// It needs a local Docker daemon (the nodes run on the host's network) and
// fails t otherwise, never skips it. The options of StartRedis that apply
// are the image and the startup timeout.
func StartRedisCluster(t testing.TB, opts ...RedisOption) *RedisCluster {
	t.Helper()
	return clusterService.start(t, opts)
}

// clusterService is how StartRedisCluster gets a Redis Cluster.
var clusterService = service[*RedisCluster, RedisOption]{
	run: func(ctx context.Context, opts []RedisOption) (*RedisCluster, error) {
		return RunRedisCluster(ctx, opts...)
	},
	timeout:  hostRedisTimeout,
	describe: func(c *RedisCluster) string { return fmt.Sprintf("Redis Cluster at %v", c.Addrs) },
}

// RunRedisCluster starts a Redis Cluster; ctx governs the start. The
// caller must call Terminate; on error no container is left running.
func RunRedisCluster(ctx context.Context, opts ...RedisOption) (*RedisCluster, error) {
	ctr, ports, err := runHostRedis(ctx, "a Redis Cluster", opts, clusterPorts, clusterScript)
	if err != nil {
		return nil, err
	}
	c := &RedisCluster{Container: ctr, base: newBase("Redis Cluster", ctr)}
	for _, p := range ports {
		c.Addrs = append(c.Addrs, loopback(p))
	}
	return c, nil
}

// clusterScript starts a node on each port and makes them a cluster.
func clusterScript(w *strings.Builder, ports []int) {
	var addrs []string
	for _, p := range ports {
		fmt.Fprintf(w, "redis-server --port %d --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes-%d.conf "+
			"--cluster-node-timeout 2000 --cluster-announce-ip 127.0.0.1 --save '' --appendonly no "+
			"--daemonize yes --logfile /data/%d.log --dir /data\n", p, p, p)
		addrs = append(addrs, loopback(p))
	}
	for _, p := range ports {
		fmt.Fprintf(w, "until redis-cli -p %d ping >/dev/null 2>&1; do sleep 0.05; done\n", p)
	}
	fmt.Fprintf(w, "redis-cli --cluster create %s --cluster-yes >/data/create.log 2>&1\n", strings.Join(addrs, " "))
	for _, p := range ports {
		fmt.Fprintf(w, "until redis-cli -p %d cluster info | grep -q cluster_state:ok; do sleep 0.05; done\n", p)
	}
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
func (c *RedisCluster) Terminate(ctx context.Context) error { return terminate(ctx, c) }
