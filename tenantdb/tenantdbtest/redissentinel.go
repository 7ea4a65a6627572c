package tenantdbtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/testcontainers/testcontainers-go"
)

// SentinelMaster is the master name StartRedisSentinel's sentinels monitor.
const SentinelMaster = "tenantdb"

// RedisSentinel is a master, two replicas and three sentinels for tests,
// started by StartRedisSentinel or RunRedisSentinel: six redis-server
// processes (the sentinels with --sentinel) in one container on the host's
// network, on ports picked free, all announcing 127.0.0.1.
type RedisSentinel struct {
	// MasterName is what the sentinels monitor, for
	// redis.FailoverOptions.MasterName.
	MasterName string
	// SentinelAddrs are the sentinels' host:port.
	SentinelAddrs []string
	// MasterAddr and ReplicaAddrs are the servers' host:port at the start;
	// a failover promotes one of the replicas.
	MasterAddr   string
	ReplicaAddrs []string
	// Container runs them all.
	Container testcontainers.Container

	base
}

// Failover asks a sentinel to fail the master over to a replica at once
// (SENTINEL FAILOVER), as after the master was found down; ctx governs the
// request. The roles have changed when the sentinels report the new master.
func (s *RedisSentinel) Failover(ctx context.Context) error {
	_, port, _ := net.SplitHostPort(s.SentinelAddrs[0])
	code, out, err := s.Container.Exec(ctx, []string{"redis-cli", "-p", port, "sentinel", "failover", s.MasterName})
	if err != nil {
		return fmt.Errorf("tenantdbtest: sentinel failover: %w", err)
	}
	b, _ := io.ReadAll(out)
	if code != 0 || !strings.Contains(string(b), "OK") {
		return fmt.Errorf("tenantdbtest: sentinel failover: exit %d: %s", code, b)
	}
	return nil
}

// Freeze stops (SIGSTOP) the server first started as master, or resumes it
// (SIGCONT) when freeze is false: a frozen master keeps its connections but
// answers nothing, as a master hung or cut off would, and the sentinels fail
// it over once it has been silent for a second. ctx governs the request.
func (s *RedisSentinel) Freeze(ctx context.Context, freeze bool) error {
	return s.signal(ctx, s.MasterAddr, freeze)
}

// FreezeReplicas stops (SIGSTOP) the servers first started as replicas, or
// resumes them (SIGCONT) when freeze is false: the master then has no
// replica that confirms its writes (WAIT). ctx governs the request.
func (s *RedisSentinel) FreezeReplicas(ctx context.Context, freeze bool) error {
	for _, r := range s.ReplicaAddrs {
		if err := s.signal(ctx, r, freeze); err != nil {
			return err
		}
	}
	return nil
}

// signal stops or continues the redis-server listening on addr.
func (s *RedisSentinel) signal(ctx context.Context, addr string, freeze bool) error {
	_, port, _ := net.SplitHostPort(addr)
	sig := "CONT"
	if freeze {
		sig = "STOP"
	}
	code, out, err := s.Container.Exec(ctx, []string{"sh", "-c", "kill -" + sig + " $(cat /data/" + port + ".pid)"})
	if err != nil {
		return fmt.Errorf("tenantdbtest: kill -%s %s: %w", sig, addr, err)
	}
	if code != 0 {
		b, _ := io.ReadAll(out)
		return fmt.Errorf("tenantdbtest: kill -%s %s: exit %d: %s", sig, addr, code, b)
	}
	return nil
}

// StartRedisSentinel returns a Sentinel set-up for t, terminated when t
// ends. It needs a local Docker daemon and fails t otherwise.
func StartRedisSentinel(t testing.TB, opts ...RedisOption) *RedisSentinel {
	t.Helper()
	return sentinelService.start(t, opts)
}

// RunRedisSentinel starts a Sentinel set-up; ctx governs the start. The
// caller must call Terminate; on error no container is left running.
func RunRedisSentinel(ctx context.Context, opts ...RedisOption) (*RedisSentinel, error) {
	pick := func() ([]int, error) { return freePorts(6) }
	ctr, ports, err := runHostRedis(ctx, "Redis Sentinel", opts, pick, sentinelScript)
	if err != nil {
		return nil, err
	}
	s := &RedisSentinel{
		MasterName: SentinelMaster,
		MasterAddr: loopback(ports[0]),
		Container:  ctr,
		base:       newBase("Redis Sentinel", ctr),
	}
	for _, p := range ports[1:3] {
		s.ReplicaAddrs = append(s.ReplicaAddrs, loopback(p))
	}
	for _, p := range ports[3:] {
		s.SentinelAddrs = append(s.SentinelAddrs, loopback(p))
	}
	return s, nil
}

// sentinelService is how StartRedisSentinel gets a Sentinel set-up.
var sentinelService = service[*RedisSentinel, RedisOption]{
	run: func(ctx context.Context, opts []RedisOption) (*RedisSentinel, error) {
		return RunRedisSentinel(ctx, opts...)
	},
	timeout: hostRedisTimeout,
	describe: func(s *RedisSentinel) string {
		return fmt.Sprintf("Redis master %s, replicas %v, sentinels %v", s.MasterAddr, s.ReplicaAddrs, s.SentinelAddrs)
	},
}

// sentinelScript starts a master on ports[0], its replicas on ports[1:3]
// and a sentinel on each further port.
func sentinelScript(w *strings.Builder, ports []int) {
	m, replicas, sentinels := ports[0], ports[1:3], ports[3:]
	server := "redis-server --port %d --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --logfile /data/%d.log " +
		"--pidfile /data/%d.pid --dir /data"
	fmt.Fprintf(w, server+"\n", m, m, m)
	for _, r := range replicas {
		fmt.Fprintf(w, server+" --replicaof 127.0.0.1 %d --replica-announce-ip 127.0.0.1\n", r, r, r, m)
	}
	for _, r := range replicas {
		fmt.Fprintf(w, "until redis-cli -p %d info replication | grep -q master_link_status:up; do sleep 0.05; done\n", r)
	}
	for _, s := range sentinels {
		fmt.Fprintf(w, "printf 'port %d\\nbind 127.0.0.1\\nsentinel announce-ip 127.0.0.1\\nsentinel monitor %s 127.0.0.1 %d 2\\n"+
			"sentinel down-after-milliseconds %s 1000\\nsentinel failover-timeout %s 3000\\n' > /data/sentinel-%d.conf\n",
			s, SentinelMaster, m, SentinelMaster, SentinelMaster, s)
		fmt.Fprintf(w, "redis-server /data/sentinel-%d.conf --sentinel --daemonize yes --logfile /data/sentinel-%d.log\n", s, s)
	}
	for _, s := range sentinels {
		fmt.Fprintf(w, "until redis-cli -p %d info sentinel | grep -q 'status=ok,.*slaves=2,sentinels=3'; do sleep 0.05; done\n", s)
	}
}

// freePorts picks n ports free now on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("tenantdbtest: pick a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Terminate stops and removes the container; only the first call does
// anything.
func (s *RedisSentinel) Terminate(ctx context.Context) error { return terminate(ctx, s) }
