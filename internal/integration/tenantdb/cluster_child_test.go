package tenantdb_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool/redislimit"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// The cluster tests run several processes: this test binary, re-executed
// with -test.run=^TestClusterChild$ and the variables below. A child talks
// to its parent in lines on stdout that begin with clusterLinePrefix, and
// takes commands from stdin. It reaches the parent's PostgreSQL through
// TENANTDB_POSTGRES_DSN (TestMain then starts no container).
const (
	clusterRoleEnv    = "TENANTDB_CLUSTER_CHILD"  // "flood", "hold" or "stall"; unset: not a child
	clusterRedisEnv   = "TENANTDB_CLUSTER_REDIS"  // Redis address
	clusterPrefixEnv  = "TENANTDB_CLUSTER_PREFIX" // redislimit key prefix
	clusterTagEnv     = "TENANTDB_CLUSTER_TAG"    // in every query, for pg_stat_activity
	clusterOnEnv      = "TENANTDB_CLUSTER_ON"     // "1": use the limiter (flood)
	clusterTTLEnv     = "TENANTDB_CLUSTER_TTL"    // lease TTL (hold)
	clusterLinePrefix = "cluster-child: "

	clusterNoisyCap     = 4  // the noisy tenant's plan cap, in each process and cluster-wide
	clusterNoisyWorkers = 12 // noisy requests in flight per process: three times its cap
	clusterMaxConns     = 10 // each process's pgxpool
	clusterHeldSlots    = 4  // slots the hold child keeps
)

// clusterChildResult is what a flood child reports when told to stop.
type clusterChildResult struct {
	QuietUnloaded, QuietLoaded []float64 // quiet query latencies, ms
	// Stalled is the share of the flood in which the process could not
	// run (tenantdbtest.StallProbe.Share): a starved machine's mark.
	Stalled                float64
	NoisyDone, NoisyFailed int64
	FirstError             string
	ClusterLocal           uint64
	Limiter                redislimit.Stats
}

// clusterNoisySQL and clusterQuietSQL are the two tenants' queries, tagged so that the
// parent can tell them apart in pg_stat_activity.
func clusterNoisySQL(tag string) string {
	return "select pg_sleep(0.05) /* tenant=noisy tag=" + tag + " */"
}
func clusterQuietSQL(tag string) string {
	return "select pg_sleep(0.02) /* tenant=quiet tag=" + tag + " */"
}
func clusterHoldSQL(tag string) string {
	return "select pg_sleep(120) /* tenant=killed tag=" + tag + " */"
}

// TestClusterChild is a child process of the cluster tests; run alone it
// is skipped.
func TestClusterChild(t *testing.T) {
	role := os.Getenv(clusterRoleEnv)
	if role == "" {
		t.Skip("a child process of the cluster tests")
	}
	switch role {
	case "flood":
		clusterChildFlood(t)
	case "hold":
		clusterChildHold(t)
	case "stall":
		clusterChildStall(t)
	default:
		t.Fatalf("unknown role %q", role)
	}
}

func clusterSay(format string, args ...any) {
	fmt.Fprintf(os.Stdout, clusterLinePrefix+format+"\n", args...)
}

func clusterChildLimiter(t *testing.T, ttl time.Duration) *redislimit.Limiter {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(clusterRedisEnv)})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := redislimit.New(redislimit.Config{Client: rdb, Prefix: os.Getenv(clusterPrefixEnv), LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close) // after the pool's Close: cleanups run last-in first-out
	return l
}

func clusterChildConfig(cluster *redislimit.Limiter) tenantdb.Config {
	cfg := tenantdb.Config{
		Plans: map[string]tenantdb.Plan{
			"noisy": {MaxConns: clusterNoisyCap, MaxWaiting: tenantdb.Unbounded},
			"quiet": {MaxConns: clusterNoisyCap, MaxWaiting: tenantdb.Unbounded},
		},
		DefaultPlan: "quiet",
		Lookup: func(_ context.Context, id string) (tenantdb.Tenant, error) {
			if id == "noisy" || id == "killed" {
				return tenantdb.Tenant{Plan: "noisy"}, nil
			}
			return tenantdb.Tenant{Plan: "quiet"}, nil
		},
	}
	if cluster != nil {
		cfg.Cluster = cluster
	}
	return cfg
}

// clusterChildFlood measures the quiet tenant alone, says "ready", and on "go"
// floods the noisy tenant while it keeps measuring the quiet one, until
// "stop"; then it reports a clusterChildResult.
func clusterChildFlood(t *testing.T) {
	tag := os.Getenv(clusterTagEnv)
	var lim *redislimit.Limiter
	if os.Getenv(clusterOnEnv) == "1" {
		lim = clusterChildLimiter(t, 0)
	}
	p := newPool(t, sharedPG, clusterMaxConns, clusterChildConfig(lim))
	quiet := func(n int, stop <-chan struct{}) []float64 {
		var ms []float64
		for i := 0; n == 0 || i < n; i++ {
			select {
			case <-stop:
				return ms
			default:
			}
			start := time.Now()
			if _, err := p.Exec(as("quiet"), clusterQuietSQL(tag)); err != nil {
				t.Errorf("quiet: %v", err)
				return ms
			}
			ms = append(ms, float64(time.Since(start).Microseconds())/1000)
		}
		return ms
	}
	quiet(3, nil) // connections, plans, Redis scripts
	var res clusterChildResult
	res.QuietUnloaded = quiet(20, nil)

	in := bufio.NewScanner(os.Stdin)
	clusterSay("ready")
	if !in.Scan() || in.Text() != "go" {
		t.Fatalf("expected go, got %q", in.Text())
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var done, failed atomic.Int64
	var firstErr sync.Once
	for range clusterNoisyWorkers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(as("noisy"), time.Minute)
				_, err := p.Exec(ctx, clusterNoisySQL(tag))
				cancel()
				if err != nil {
					failed.Add(1)
					firstErr.Do(func() { res.FirstError = err.Error() })
					continue
				}
				done.Add(1)
			}
		})
	}
	stall := tenantdbtest.StartStallProbe()
	loaded := make(chan []float64, 1)
	go func() { loaded <- quiet(0, stop) }()
	if !in.Scan() || in.Text() != "stop" {
		t.Errorf("expected stop, got %q", in.Text())
	}
	close(stop)
	wg.Wait()
	res.QuietLoaded = <-loaded
	res.Stalled = stall.Share()
	stall.Stop()
	res.NoisyDone, res.NoisyFailed = done.Load(), failed.Load()
	res.ClusterLocal = p.Stat().Tenants.ClusterLocal
	if lim != nil {
		res.Limiter = lim.Stats()
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	clusterSay("result %s", b)
}

// clusterChildHold takes clusterHeldSlots of the "killed" tenant's slots with long
// queries, says "holding" once the slots are in Redis, and waits to be
// killed.
func clusterChildHold(t *testing.T) {
	tag := os.Getenv(clusterTagEnv)
	ttl, err := time.ParseDuration(os.Getenv(clusterTTLEnv))
	if err != nil {
		t.Fatal(err)
	}
	lim := clusterChildLimiter(t, ttl)
	p := newPool(t, sharedPG, clusterMaxConns, clusterChildConfig(lim))
	for range clusterHeldSlots {
		go func() { _, _ = p.Exec(as("killed"), clusterHoldSQL(tag)) }()
	}
	eventually(t, fmt.Sprintf("the hold child holds %d slots", clusterHeldSlots),
		func() bool { return lim.Stats().Held >= clusterHeldSlots })
	clusterSay("holding %s", strconv.Itoa(os.Getpid()))
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until killed
	t.Fatal("the hold child was not killed")
}

// clusterChildStall is clusterChildHold with a FailClosed limiter: it says
// "holding", and once its queries end (the parent stops the process with
// SIGSTOP past the lease TTL and lets it go on: its leases are revoked, its
// queries cancelled) it says "revoked" and how many of them ended with
// ErrRevoked, then waits to be killed.
func clusterChildStall(t *testing.T) {
	tag := os.Getenv(clusterTagEnv)
	ttl, err := time.ParseDuration(os.Getenv(clusterTTLEnv))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(clusterRedisEnv)})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := redislimit.New(redislimit.Config{Client: rdb, Prefix: os.Getenv(clusterPrefixEnv), LeaseTTL: ttl,
		Mode: redislimit.FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	p := newPool(t, sharedPG, clusterMaxConns, clusterChildConfig(lim))
	errs := make(chan error, clusterHeldSlots)
	for range clusterHeldSlots {
		go func() {
			_, err := p.Exec(as("killed"), clusterHoldSQL(tag))
			errs <- err
		}()
	}
	eventually(t, fmt.Sprintf("the stall child holds %d slots", clusterHeldSlots),
		func() bool { return lim.Stats().Held >= clusterHeldSlots })
	clusterSay("holding %s", strconv.Itoa(os.Getpid()))
	revoked := 0
	for range clusterHeldSlots {
		if errors.Is(<-errs, tenantdb.ErrRevoked) {
			revoked++
		}
	}
	clusterSay("revoked %d", revoked)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until killed
}
