package tenantdbtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
)

// ErrNoContainer is returned by the fault-injection methods (Stop, Start,
// Restart, Pause, Unpause) of a server that tenantdbtest did not start,
// because an environment variable such as TENANTDB_POSTGRES_DSN pointed it
// at an existing one: only a container can be stopped on demand.
var ErrNoContainer = errors.New("tenantdbtest: fault injection needs a container started by tenantdbtest, not an existing server")

// hostPortAttempts bounds the retries when a host port picked as free is
// taken by someone else before Docker binds it.
const hostPortAttempts = 3

// dockerEnv is what the helpers learn from Docker before they start a
// container.
type dockerEnv struct {
	provider *testcontainers.DockerProvider // closed once images.connect returns
	// host is where published ports are reached: 127.0.0.1 for a local
	// daemon, the daemon's host otherwise.
	host string
	// bindIP is the host address fixed port bindings use: loopback for a
	// local daemon, so test servers with well-known passwords are not
	// published to the network; unset (all addresses) otherwise.
	bindIP netip.Addr
}

// connectDocker checks that Docker answers, so that a machine without it
// gets a message that says what to do instead of testcontainers' own
// wording. service names what was to be started, envVar the variable that
// would point at an existing server instead.
func connectDocker(ctx context.Context, service, envVar string) (*dockerEnv, error) {
	hint := func(err error) error {
		return fmt.Errorf("tenantdbtest: starting %s needs Docker, which is not available: %w; "+
			"install and start Docker Engine (https://docs.docker.com/engine/install/, on Debian: apt-get install docker.io) "+
			"and make sure this user may use it (DOCKER_HOST, the docker group), "+
			"or set %s to use an existing server", service, err, envVar)
	}
	// testcontainers falls back to the default socket when DOCKER_HOST
	// does not answer; a DOCKER_HOST that was set on purpose but is dead
	// is better reported than silently replaced.
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		if err := pingDockerHost(ctx); err != nil {
			return nil, hint(fmt.Errorf("DOCKER_HOST=%s: %w", h, err))
		}
	}
	disableReaperWhereUnavailable(ctx)
	provider, err := newProvider()
	if err != nil {
		return nil, hint(err)
	}
	if err := provider.Health(ctx); err != nil {
		_ = provider.Close()
		return nil, hint(err)
	}
	hostOverrideOnce.Do(func() { overrideHostForLocalDaemon(provider) })
	host, err := provider.DaemonHost(ctx)
	if err != nil {
		_ = provider.Close()
		return nil, fmt.Errorf("tenantdbtest: find the Docker host: %w", err)
	}
	d := &dockerEnv{provider: provider, host: host}
	if host == "localhost" {
		d.host = "127.0.0.1"
	}
	if ip, err := netip.ParseAddr(d.host); err == nil && ip.IsLoopback() {
		d.bindIP = netip.MustParseAddr("127.0.0.1")
		d.host = "127.0.0.1"
	}
	return d, nil
}

func pingDockerHost(ctx context.Context) error {
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return err
	}
	defer cli.Close()
	_, err = cli.Ping(ctx, client.PingOptions{})
	return err
}

var hostOverrideOnce sync.Once

// overrideHostForLocalDaemon sets TESTCONTAINERS_HOST_OVERRIDE=localhost
// when this process runs in a container (/.dockerenv exists) whose own
// network namespace is the Docker daemon's, as on our CI machines.
//
// Inside a container testcontainers assumes Docker-in-Docker through a
// mounted socket, where published ports are on the host, and reaches them at
// the default bridge's gateway or, when the bridge reports none (Docker
// 20.10 does not), at the container's default route: here an address
// outside the machine that never answers, so every wait times out. When the
// daemon shares our network namespace its published ports are on loopback.
// A user's own TESTCONTAINERS_HOST_OVERRIDE is left alone.
func overrideHostForLocalDaemon(p *testcontainers.DockerProvider) {
	if _, ok := os.LookupEnv("TESTCONTAINERS_HOST_OVERRIDE"); ok {
		return
	}
	if _, err := os.Stat("/.dockerenv"); err != nil {
		return
	}
	if !strings.HasPrefix(p.Client().DaemonHost(), "unix://") {
		return
	}
	if daemonSharesNetNS() {
		_ = os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "localhost")
	}
}

// daemonSharesNetNS reports whether the Docker daemon whose pid file is in
// the usual place runs in this process's network namespace.
func daemonSharesNetNS() bool {
	pid, err := os.ReadFile("/var/run/docker.pid")
	if err != nil {
		return false
	}
	theirs, err := os.Readlink("/proc/" + strings.TrimSpace(string(pid)) + "/ns/net")
	if err != nil {
		return false
	}
	ours, err := os.Readlink("/proc/self/ns/net")
	return err == nil && theirs == ours
}

// newProvider wraps testcontainers.NewDockerProvider, which in some
// configurations panics instead of returning an error when it finds no
// Docker host.
func newProvider() (p *testcontainers.DockerProvider, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	return testcontainers.NewDockerProvider()
}

func (d *dockerEnv) close() { _ = d.provider.Close() }

// freePort returns a TCP port that is free on ip (all addresses when ip is
// unset) at the time of the call.
func freePort(ip netip.Addr) (int, error) {
	addr := ":0"
	if ip.IsValid() {
		addr = net.JoinHostPort(ip.String(), "0")
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// withHostPort binds containerPort (like "5432/tcp") to a fixed host port,
// or to one Docker picks when hostPort is 0.
// Docker keeps an explicit binding across stop and start of the container,
// where an ephemeral one (testcontainers' default) usually changes, which
// would invalidate every DSN handed out before a restart.
func withHostPort(containerPort string, ip netip.Addr, hostPort int) testcontainers.CustomizeRequestOption {
	p := network.MustParsePort(containerPort)
	return testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
		if hc.PortBindings == nil {
			hc.PortBindings = network.PortMap{}
		}
		hc.PortBindings[p] = []network.PortBinding{{HostIP: ip, HostPort: strconv.Itoa(hostPort)}}
	})
}

// isPortConflict reports whether err says a host port was taken.
func isPortConflict(err error) bool {
	s := err.Error()
	return strings.Contains(s, "port is already allocated") || strings.Contains(s, "address already in use")
}

// pickHostPort is freePort; a test replaces it to hand out a taken port.
var pickHostPort = freePort

// runOnFreeHostPort calls run with a host port that was free a moment ago,
// and again with another one when run's error says that something took it
// in between (Docker's, or one run makes from the container's log). On
// error the container, if any, is returned too, so that the caller can
// terminate it.
func runOnFreeHostPort[C testcontainers.Container](d *dockerEnv, run func(hostPort int) (C, error)) (C, int, error) {
	var (
		c   C
		err error
	)
	for range hostPortAttempts {
		var port int
		port, err = pickHostPort(d.bindIP)
		if err != nil {
			return c, 0, fmt.Errorf("tenantdbtest: pick a free host port: %w", err)
		}
		c, err = run(port)
		if err == nil || !isPortConflict(err) {
			return c, port, err
		}
		_ = testcontainers.TerminateContainer(c)
		var zero C
		c = zero
	}
	return c, 0, err
}

// mappedHostPort returns the host port Docker published containerPort on.
func mappedHostPort(ctx context.Context, c testcontainers.Container, containerPort string) (int, error) {
	p, err := c.MappedPort(ctx, containerPort)
	if err != nil {
		return 0, err
	}
	return int(p.Num()), nil
}

// setPaused pauses or unpauses c, freezing its processes: clients keep
// their connections but get no answers, unlike after Stop.
func setPaused(ctx context.Context, c testcontainers.Container, pause bool) error {
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("tenantdbtest: docker client: %w", err)
	}
	defer cli.Close()
	if pause {
		_, err = cli.ContainerPause(ctx, c.GetContainerID(), client.ContainerPauseOptions{})
	} else {
		_, err = cli.ContainerUnpause(ctx, c.GetContainerID(), client.ContainerUnpauseOptions{})
	}
	return err
}

// terminator makes Terminate idempotent: a container may be terminated by
// its owner and again by a cleanup.
type terminator struct {
	once sync.Once
	err  error
}

func (t *terminator) do(ctx context.Context, c testcontainers.Container, what string) error {
	t.once.Do(func() {
		if err := c.Terminate(ctx); err != nil {
			t.err = fmt.Errorf("tenantdbtest: terminate %s: %w", what, err)
		}
	})
	return t.err
}
