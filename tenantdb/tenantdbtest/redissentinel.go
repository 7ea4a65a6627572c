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

	term terminator
}

// StartRedisSentinel returns a Sentinel set-up for t, terminated when t
// ends. It needs a local Docker daemon and fails t otherwise.
func StartRedisSentinel(t testing.TB, opts ...RedisOption) *RedisSentinel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := RunRedisSentinel(ctx, opts...)
	if s != nil && s.Container != nil {
		testcontainers.CleanupContainer(t, s.Container)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tenantdbtest: Redis master %s, replicas %v, sentinels %v", s.MasterAddr, s.ReplicaAddrs, s.SentinelAddrs)
	return s
}

// RunRedisSentinel starts a Sentinel set-up; ctx governs the start. The
// caller must call Terminate; on error no container is left running.
func RunRedisSentinel(ctx context.Context, opts ...RedisOption) (*RedisSentinel, error) {
	cfg, image, err := hostRedisImage(ctx, "Redis Sentinel", opts)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	addr := func(p int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)) }
	m, replicas, sentinels := ports[0], ports[1:3], ports[3:]
	var sb strings.Builder
	sb.WriteString("set -e\ncd /data\n")
	server := "redis-server --port %d --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --logfile /data/%d.log " +
		"--pidfile /data/%d.pid --dir /data"
	fmt.Fprintf(&sb, server+"\n", m, m, m)
	for _, r := range replicas {
		fmt.Fprintf(&sb, server+" --replicaof 127.0.0.1 %d --replica-announce-ip 127.0.0.1\n", r, r, r, m)
	}
	for _, r := range replicas {
		fmt.Fprintf(&sb, "until redis-cli -p %d info replication | grep -q master_link_status:up; do sleep 0.05; done\n", r)
	}
	for _, s := range sentinels {
		fmt.Fprintf(&sb, "printf 'port %d\\nbind 127.0.0.1\\nsentinel announce-ip 127.0.0.1\\nsentinel monitor %s 127.0.0.1 %d 2\\n"+
			"sentinel down-after-milliseconds %s 1000\\nsentinel failover-timeout %s 3000\\n' > /data/sentinel-%d.conf\n",
			s, SentinelMaster, m, SentinelMaster, SentinelMaster, s)
		fmt.Fprintf(&sb, "redis-server /data/sentinel-%d.conf --sentinel --daemonize yes --logfile /data/sentinel-%d.log\n", s, s)
	}
	for _, s := range sentinels {
		fmt.Fprintf(&sb, "until redis-cli -p %d info sentinel | grep -q 'status=ok,.*slaves=2,sentinels=3'; do sleep 0.05; done\n", s)
	}
	sb.WriteString("echo 'tenantdbtest: sentinel ready'\nexec sleep infinity\n")

	ctr, err := runHostRedis(ctx, cfg, image, "Redis Sentinel", sb.String(), "tenantdbtest: sentinel ready")
	if err != nil {
		return nil, err
	}
	s := &RedisSentinel{MasterName: SentinelMaster, MasterAddr: addr(m)}
	for _, r := range replicas {
		s.ReplicaAddrs = append(s.ReplicaAddrs, addr(r))
	}
	for _, p := range sentinels {
		s.SentinelAddrs = append(s.SentinelAddrs, addr(p))
	}
	s.Container = ctr
	return s, nil
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
func (s *RedisSentinel) Terminate(ctx context.Context) error {
	if s == nil || s.Container == nil {
		return nil
	}
	return s.term.do(ctx, s.Container, "Redis Sentinel")
}
