package tenantdb_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool/redislimit"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// clusterChild is a running child process (see TestClusterChild).
type clusterChild struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // protocol lines, prefix removed
	out    *clusterOutput
	exited chan error
}

type clusterOutput struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *clusterOutput) add(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.WriteString(s + "\n")
}

func (b *clusterOutput) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startClusterChild re-executes this test binary as a child with env added. It is
// killed when t ends, if it has not exited by then.
func startClusterChild(t *testing.T, env ...string) *clusterChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestClusterChild$", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), "TENANTDB_POSTGRES_DSN="+sharedPG.DSN)
	cmd.Env = append(cmd.Env, env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &clusterChild{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 16), out: &clusterOutput{}, exited: make(chan error, 1)}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			c.out.add(line)
			if rest, ok := strings.CutPrefix(line, clusterLinePrefix); ok {
				c.lines <- rest
			}
		}
		close(c.lines)
		c.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
	})
	return c
}

// expect waits for the child's next protocol line, which must begin with
// word, and returns the rest of it.
func (c *clusterChild) expect(word string) string {
	c.t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			c.t.Fatalf("child %d exited before %q:\n%s", c.cmd.Process.Pid, word, c.out)
		}
		rest, ok := strings.CutPrefix(line, word)
		if !ok {
			c.t.Fatalf("child %d said %q, want %q:\n%s", c.cmd.Process.Pid, line, word, c.out)
		}
		return strings.TrimSpace(rest)
	case <-time.After(2 * time.Minute):
		c.t.Fatalf("child %d did not say %q:\n%s", c.cmd.Process.Pid, word, c.out)
		return ""
	}
}

func (c *clusterChild) send(cmd string) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, cmd+"\n"); err != nil {
		c.t.Fatalf("to child %d: %v", c.cmd.Process.Pid, err)
	}
}

// wait waits for the child to exit and fails t if it failed.
func (c *clusterChild) wait() {
	c.t.Helper()
	select {
	case err := <-c.exited:
		c.exited <- err // for the cleanup
		if err != nil {
			c.t.Fatalf("child %d: %v:\n%s", c.cmd.Process.Pid, err, c.out)
		}
	case <-time.After(2 * time.Minute):
		c.t.Fatalf("child %d did not exit:\n%s", c.cmd.Process.Pid, c.out)
	}
}

func clusterTag() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// clusterFloodPhase runs three flood children: each measures the quiet tenant
// alone, then floods the noisy tenant (three times its cap in flight) for
// floodFor (and until shown holds for the peak so far) while it measures the
// quiet one again. The sampler watches the noisy tenant's active backends
// across all of them.
func clusterFloodPhase(t *testing.T, redisAddr, prefix string, cluster bool, floodFor time.Duration, shown func(peak int) bool) (maxActive int64, res []clusterChildResult, slowest time.Duration) {
	t.Helper()
	// How slowly Redis answers during the phase, pinged every 50 ms: a
	// machine that starves Redis makes the limiters time out and degrade,
	// as they must, and the phase cannot show what a healthy one does.
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	pinging, pinged := make(chan struct{}), make(chan time.Duration, 1)
	go func() {
		var worst time.Duration
		defer func() { pinged <- worst }()
		for {
			select {
			case <-pinging:
				return
			case <-time.After(50 * time.Millisecond):
			}
			start := time.Now()
			_ = rdb.Ping(context.Background()).Err()
			worst = max(worst, time.Since(start))
		}
	}()
	defer func() { close(pinging); slowest = <-pinged }()
	tag := clusterTag()
	on := "0"
	if cluster {
		on = "1"
	}
	var children []*clusterChild
	for range 3 {
		children = append(children, startClusterChild(t, clusterRoleEnv+"=flood", clusterRedisEnv+"="+redisAddr,
			clusterPrefixEnv+"="+prefix, clusterTagEnv+"="+tag, clusterOnEnv+"="+on))
	}
	for _, c := range children {
		c.expect("ready")
	}
	sampler := startActivitySampler(t, "tenant=noisy tag="+tag)
	for _, c := range children {
		c.send("go")
	}
	// The scenario's length, at least 100 samples of it and the peak it is
	// there to show: a busy machine samples, and fills slots, more slowly.
	flooding := time.Now()
	ran := func() bool {
		return time.Since(flooding) >= floodFor && sampler.samples() >= 100 && shown(sampler.peak())
	}
	deadline := time.Now().Add(time.Minute)
	for !ran() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // polling the sampler, not synchronisation
	}
	if !ran() {
		t.Errorf("in %v the flood did not run its length, watched by 100 samples, and show its peak: %d samples, peak %d noisy backends; the children said:",
			time.Minute, sampler.samples(), sampler.peak())
		for _, c := range children {
			t.Errorf("child %d:\n%s", c.cmd.Process.Pid, c.out)
		}
	}
	maxActive, samples := int64(sampler.stop()), sampler.samples()
	for _, c := range children {
		c.send("stop")
	}
	for _, c := range children {
		var r clusterChildResult
		if err := json.Unmarshal([]byte(c.expect("result")), &r); err != nil {
			t.Fatal(err)
		}
		res = append(res, r)
		c.wait()
	}
	t.Logf("cluster limiter %v: %d samples, at most %d noisy backends active at once", cluster, samples, maxActive)
	if samples < 100 {
		t.Errorf("only %d samples of pg_stat_activity", samples)
	}
	return maxActive, res, 0 // slowest: set by the deferred end of the pings
}

// TestClusterThreeProcessesShareCap runs three processes, each with its own
// pool of 10 connections and the noisy tenant's plan cap of 4, flooding the
// noisy tenant with three times its cap each. Without the cluster limiter
// PostgreSQL sees the noisy tenant's backends go above 4 (up to 12); with
// it, never. Meanwhile the quiet tenant's median latency stays close to its
// median measured alone in the same processes.
// redisStarved is how slow a PING must be for TestClusterThreeProcessesShareCap
// to call Redis starved: half the limiters' OpTimeout (its default).
const redisStarved = 250 * time.Millisecond

func TestClusterThreeProcessesShareCap(t *testing.T) {
	r := tenantdbtest.StartRedis(t)
	prefix := "cluster-" + clusterTag()
	const floodFor = 3 * time.Second

	maxOff, _, _ := clusterFloodPhase(t, r.Addr, prefix, false, floodFor, func(peak int) bool { return peak > clusterNoisyCap })
	if maxOff <= clusterNoisyCap {
		t.Errorf("without the limiter at most %d noisy backends: the test does not show what the limiter prevents", maxOff)
	}

	maxOn, res, slowest := clusterFloodPhase(t, r.Addr, prefix, true, floodFor, func(peak int) bool { return peak >= clusterNoisyCap-1 })
	if slowest >= redisStarved {
		errs := 0
		for _, r := range res {
			errs += int(r.Limiter.Errors)
		}
		if errs > 0 {
			t.Skipf("Redis took %v to answer a PING during the flood and the limiters saw %d errors: they degraded, as they must on a machine that starves Redis, and the cap of a healthy run could not be judged (at most %d noisy backends)", slowest, errs, maxOn)
		}
	}
	if maxOn > clusterNoisyCap {
		t.Errorf("with the limiter %d noisy backends were active at once, above the cluster cap %d", maxOn, clusterNoisyCap)
	}
	if maxOn < clusterNoisyCap-1 {
		t.Errorf("with the limiter at most %d noisy backends: the flood did not fill the cap %d", maxOn, clusterNoisyCap)
	}
	var unloaded, loaded []float64
	var stalled float64
	for i, r := range res {
		t.Logf("process %d: noisy %d done, %d failed; quiet median %.1f ms alone, %.1f ms under the flood (could not run %.0f%% of it); limiter %+v",
			i, r.NoisyDone, r.NoisyFailed, median(r.QuietUnloaded), median(r.QuietLoaded), 100*r.Stalled, r.Limiter)
		stalled = max(stalled, r.Stalled)
		if r.NoisyDone == 0 {
			t.Errorf("process %d completed no noisy query: starved", i)
		}
		if r.NoisyFailed != 0 {
			t.Errorf("process %d: %d noisy queries failed, first: %s", i, r.NoisyFailed, r.FirstError)
		}
		if r.ClusterLocal != 0 || r.Limiter.FailOpenGrants != 0 || r.Limiter.Errors != 0 || r.Limiter.LostLeases != 0 {
			t.Errorf("process %d: Redis trouble in a healthy run: %+v", i, r.Limiter)
		}
		if r.Limiter.Wakeups == 0 {
			t.Errorf("process %d: no waiter was woken by a notification", i)
		}
		unloaded = append(unloaded, r.QuietUnloaded...)
		loaded = append(loaded, r.QuietLoaded...)
	}
	ratio := median(loaded) / median(unloaded)
	t.Logf("quiet tenant: median %.1f ms alone, %.1f ms under the flood (%.2fx)", median(unloaded), median(loaded), ratio)
	switch {
	case ratio <= 2:
	case stalled >= 0.25:
		// A process that could not run for a quarter of the flood says
		// more about the machine than about the limiter.
		t.Logf("the quiet tenant's median grew %.2fx with the machine starved (a process could not run %.0f%% of the flood): not judged", ratio, 100*stalled)
	default:
		t.Errorf("the quiet tenant's median latency grew %.2fx under the flood", ratio)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	// Each child closed its pool and limiter before exiting.
	key := "{" + prefix + ":noisy}:slots"
	if n, err := rdb.ZCard(context.Background(), key).Result(); err != nil || n != 0 {
		t.Errorf("ZCARD %s after the children exited = %d, %v; want 0", key, n, err)
	}
}

// TestClusterKilledProcessSlotsReturn kills (SIGKILL) a process holding
// four of a tenant's slots: nothing releases them, and they come back when
// their leases expire, within the lease TTL plus a renewal interval.
func TestClusterKilledProcessSlotsReturn(t *testing.T) {
	r := tenantdbtest.StartRedis(t)
	prefix := "cluster-" + clusterTag()
	tag := clusterTag()
	const ttl = 3 * time.Second
	renewEvery := ttl / 3
	t.Cleanup(func() { terminateBackends(t, "tenant=killed tag="+tag) })

	c := startClusterChild(t, clusterRoleEnv+"=hold", clusterRedisEnv+"="+r.Addr, clusterPrefixEnv+"="+prefix,
		clusterTagEnv+"="+tag, clusterTTLEnv+"="+ttl.String())
	c.expect("holding")

	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	lim, err := redislimit.New(redislimit.Config{Client: rdb, Prefix: prefix, LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	p := newPool(t, sharedPG, clusterMaxConns, clusterChildConfig(lim))
	key := lim.SlotsKey("killed")
	if n := rdb.ZCard(context.Background(), key).Val(); n != clusterHeldSlots {
		t.Fatalf("ZCARD %s = %d while the child holds %d", key, n, clusterHeldSlots)
	}

	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// Nothing released them: they are still taken right after the kill.
	if _, err := lim.AcquireSlot(context.Background(), "killed", clusterNoisyCap, 0); !errors.Is(err, tenantdb.ErrOverLimit) {
		t.Fatalf("right after the kill: err = %v, want ErrOverLimit", err)
	}
	// Requests that may wait get every slot once the leases expire: hold
	// connections until all four are taken.
	ctx, cancel := context.WithTimeout(as("killed"), time.Minute)
	defer cancel()
	var conns []tenantdb.Conn
	var first time.Duration
	for range clusterHeldSlots {
		conn, err := p.Acquire(ctx)
		if err != nil {
			t.Fatalf("waiting for the killed process's slots: %v", err)
		}
		defer conn.Release()
		if first == 0 {
			first = time.Since(killed)
		}
		conns = append(conns, conn)
	}
	all := time.Since(killed)
	bound := ttl + renewEvery + 2*time.Second // slack for this machine
	t.Logf("after SIGKILL: the first slot was back after %v, all %d after %v (TTL %v, bound %v)",
		first.Round(time.Millisecond), clusterHeldSlots, all.Round(time.Millisecond), ttl, bound)
	if all > bound {
		t.Errorf("the slots came back after %v, want within %v", all, bound)
	}
	if n, err := lim.InUse(context.Background(), "killed"); n != clusterHeldSlots || err != nil {
		t.Errorf("InUse while this process holds them all = %d, %v; want %d", n, err, clusterHeldSlots)
	}
	for _, conn := range conns {
		if _, err := conn.Exec(context.Background(), "select 1 /* tenant=killed */"); err != nil {
			t.Errorf("on a slot that came back: %v", err)
		}
		conn.Release()
	}
	eventually(t, "the slots are released in Redis", func() bool {
		n, err := lim.InUse(context.Background(), "killed")
		return err == nil && n == 0
	})
	assertNothingHeld(t, p)
}

// TestClusterRedisOutage stops the Redis container under load and starts
// it again, with one pool failing open and one failing closed. During the
// outage the fail-open pool serves the tenant on its local cap (counted as
// ClusterLocal) and the fail-closed pool refuses it with ErrUnavailable;
// after it both use Redis again, and no slot is left taken (the lease TTL
// is longer than the test, so nothing merely expired).
func TestClusterRedisOutage(t *testing.T) {
	r := tenantdbtest.StartRedis(t)
	prefix := "cluster-" + clusterTag()
	type side struct {
		name             string
		lim              *redislimit.Limiter
		p                *tenantdb.Pool
		ok, unavail, bad atomic.Int64
		firstBad         atomic.Value
		// down is set once both limiters noticed the outage; okDown
		// counts the queries served that started after that. A query
		// already running then may hold a lease from before the
		// outage: counting it as served during the outage made the
		// checks below fail now and then.
		down   atomic.Bool
		okDown atomic.Int64
	}
	var sides []*side
	for _, mode := range []redislimit.Mode{redislimit.FailOpen, redislimit.FailClosed} {
		rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
		t.Cleanup(func() { _ = rdb.Close() })
		lim, err := redislimit.New(redislimit.Config{Client: rdb, Prefix: prefix, Mode: mode, LeaseTTL: 2 * time.Minute,
			OpTimeout: 300 * time.Millisecond, RecheckEvery: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(lim.Close)
		p := newPool(t, sharedPG, clusterMaxConns, tenantdb.Config{
			Plans: map[string]tenantdb.Plan{"p": {MaxConns: 3, MaxWaiting: tenantdb.Unbounded}}, Cluster: lim})
		sides = append(sides, &side{name: mode.String(), lim: lim, p: p})
	}
	open, closed := sides[0], sides[1]

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, s := range sides {
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					down := s.down.Load()
					qctx, cancel := context.WithTimeout(tenantdb.WithTenant(ctx, "acme"), 30*time.Second)
					_, err := s.p.Exec(qctx, "select pg_sleep(0.01)")
					cancel()
					switch {
					case err == nil:
						s.ok.Add(1)
						if down {
							s.okDown.Add(1)
						}
					case errors.Is(err, redislimit.ErrUnavailable):
						s.unavail.Add(1)
						time.Sleep(time.Millisecond) // a client backing off
					case ctx.Err() != nil:
					default:
						s.bad.Add(1)
						s.firstBad.CompareAndSwap(nil, err.Error())
					}
				}
			})
		}
	}
	defer func() { stop(); wg.Wait() }()
	eventually(t, "both serve through Redis", func() bool { return open.ok.Load() >= 20 && closed.ok.Load() >= 20 })

	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both notice", func() bool { return !open.lim.Stats().Healthy && !closed.lim.Stats().Healthy })
	openLocal := open.p.Stat().Tenants.ClusterLocal // before down: every grant to a query started after it is counted
	open.down.Store(true)
	closed.down.Store(true)
	closedUnavail := closed.unavail.Load()
	eventually(t, "fail-open serves locally, fail-closed refuses", func() bool {
		return open.okDown.Load() >= 20 && closed.unavail.Load() >= closedUnavail+20
	})
	// Still down: no probe can have succeeded.
	if got := closed.okDown.Load(); got != 0 {
		t.Errorf("fail-closed served %d queries with Redis down", got)
	}
	if served, local := open.okDown.Load(), int64(open.p.Stat().Tenants.ClusterLocal-openLocal); local < served {
		t.Errorf("fail-open served %d queries with Redis down, only %d of them counted ClusterLocal", served, local)
	}
	if n := open.unavail.Load(); n != 0 {
		t.Errorf("fail-open returned ErrUnavailable %d times", n)
	}
	if got := closed.p.Stat().Tenants.ClusterErrors; got == 0 {
		t.Errorf("fail-closed: pool ClusterErrors = 0")
	}

	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both healthy again", func() bool { return open.lim.Stats().Healthy && closed.lim.Stats().Healthy })
	openLocal, closedOK := open.p.Stat().Tenants.ClusterLocal, closed.ok.Load()
	openOK := open.ok.Load()
	eventually(t, "both serve through Redis again", func() bool {
		return closed.ok.Load() >= closedOK+20 && open.ok.Load() >= openOK+20
	})
	if got := open.p.Stat().Tenants.ClusterLocal - openLocal; got != 0 {
		t.Errorf("fail-open granted %d local slots after Redis came back", got)
	}
	stop()
	wg.Wait()
	for _, s := range sides {
		if n := s.bad.Load(); n != 0 {
			t.Errorf("%s: %d unexpected errors, first: %v", s.name, n, s.firstBad.Load())
		}
		assertNothingHeld(t, s.p)
	}

	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	key := open.lim.SlotsKey("acme")
	eventually(t, "no slot left taken in Redis", func() bool {
		st0, st1 := open.lim.Stats(), closed.lim.Stats()
		return rdb.ZCard(context.Background(), key).Val() == 0 &&
			st0.Held+st0.LocalHeld+st0.PendingReleases+st1.Held+st1.LocalHeld+st1.PendingReleases == 0
	})
	for _, s := range sides {
		t.Logf("%s: %d served, %d refused as unavailable; limiter %+v", s.name, s.ok.Load(), s.unavail.Load(), s.lim.Stats())
	}
}

// TestPartitionStoppedProcessPastTTL stops a process (SIGSTOP) that holds
// its tenant's whole cluster cap, FailClosed, for three lease TTLs. Redis
// expires its leases and this process takes the slots. The stopped process
// cannot cancel anything while stopped: PostgreSQL runs its queries on, and
// the tenant holds twice its cap until it continues (the excess this test
// reports). Once continued, it must learn from its own clock that the leases
// are gone and cancel their queries, before using them: its queries end
// with ErrRevoked and the tenant is back within its cap.
func TestPartitionStoppedProcessPastTTL(t *testing.T) {
	r := tenantdbtest.StartRedis(t)
	prefix := "cluster-" + clusterTag()
	tag := clusterTag()
	const ttl = time.Second
	marker := "tenant=killed tag=" + tag
	t.Cleanup(func() { terminateBackends(t, marker) })
	c := startClusterChild(t, clusterRoleEnv+"=stall", clusterRedisEnv+"="+r.Addr, clusterPrefixEnv+"="+prefix,
		clusterTagEnv+"="+tag, clusterTTLEnv+"="+ttl.String())
	c.expect("holding")
	sampler := startActivitySampler(t, marker)
	eventually(t, "the child's queries run", func() bool { return sampler.current() == clusterHeldSlots })

	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	lim, err := redislimit.New(redislimit.Config{Client: rdb, Prefix: prefix, LeaseTTL: ttl, Mode: redislimit.FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	p := newPool(t, sharedPG, clusterMaxConns, clusterChildConfig(lim))

	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	continued := false
	defer func() {
		if !continued {
			_ = c.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var served atomic.Int64
	sql := "select pg_sleep(0.05) /* " + marker + " */"
	for range clusterHeldSlots {
		wg.Go(func() {
			for ctx.Err() == nil {
				qctx, cancel := context.WithTimeout(tenantdb.WithTenant(ctx, "killed"), time.Minute)
				_, err := p.Exec(qctx, sql)
				cancel()
				if err == nil {
					served.Add(1)
				} else if ctx.Err() == nil {
					t.Errorf("flood: %v", err)
				}
			}
		})
	}
	defer func() { stop(); wg.Wait() }()
	eventually(t, "this process serves the tenant, three TTLs after the stop", func() bool {
		return served.Load() > 0 && time.Since(stopped) > 3*ttl
	})
	frozenPeak := int(sampler.max.Load())
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	continued = true
	resumed := time.Now()
	got := c.expect("revoked")
	learned := time.Since(resumed)
	if got != strconv.Itoa(clusterHeldSlots) {
		t.Errorf("the continued child's queries: %s ended with ErrRevoked, want %d", got, clusterHeldSlots)
	}
	eventually(t, "the tenant back within its cap", func() bool { return sampler.current() <= clusterHeldSlots })
	back := time.Since(resumed)
	stop()
	wg.Wait()
	peak := sampler.stop()
	t.Logf("SIGSTOP past TTL (FailClosed): peak %d active backends of cap %d (excess %d, while the process was stopped: %d); "+
		"after SIGCONT the child cancelled its queries within %v, the tenant within its cap after %v; this process served %d",
		peak, clusterHeldSlots, max(0, peak-clusterHeldSlots), max(0, frozenPeak-clusterHeldSlots), learned.Round(time.Millisecond),
		back.Round(time.Millisecond), served.Load())
}
