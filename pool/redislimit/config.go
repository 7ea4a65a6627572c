package redislimit

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Mode says what AcquireSlot does when Redis cannot be asked.
type Mode int

const (
	// FailOpen grants a lease whose Local reports true: the request is then
	// limited by its process's own tenant cap only, so during an outage a
	// tenant may hold its cap once per process. The service stays up; the
	// isolation between tenants within each process stays too. A held
	// lease that Redis can no longer vouch for (not renewed in time, or
	// found gone) is not revoked: it turns local and the request runs on;
	// the next renewal puts it back in Redis under a new member.
	FailOpen Mode = iota
	// FailClosed returns an error matching ErrUnavailable: no request gets a
	// connection that the cluster cap cannot vouch for, so an outage of
	// Redis is an outage of the service. A held lease that Redis can no
	// longer vouch for is revoked: its Revoked channel closes, and tenantdb
	// cancels the query that holds it (tenantdb.ErrRevoked).
	FailClosed
)

func (m Mode) String() string {
	switch m {
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	default:
		return fmt.Sprintf("Mode(%d)", int(m))
	}
}

// Config configures a Limiter. Every field but Client is optional; zero
// means the default given in its doc.
type Config struct {
	// Client is the Redis connection: a *redis.Client (standalone, or a
	// Sentinel failover client) or a *redis.ClusterClient. Required. The
	// Limiter does not close it. OpTimeout is enforced whatever its options;
	// ContextTimeoutEnabled lets a timed-out call also stop waiting on the
	// socket at once instead of after the client's ReadTimeout.
	Client redis.UniversalClient

	// Prefix begins every key and channel name, so that several
	// deployments can share a Redis. Default "tenantdb".
	Prefix string

	// LeaseTTL is how long a slot stays taken without renewal: how soon the
	// slots of a process that died come back. Default 10 seconds. Shorter
	// means faster recovery but more renewals and less tolerance of a
	// process that stalls (a long GC pause, a starved CPU).
	LeaseTTL time.Duration

	// RenewEvery is how often held leases are renewed, all of them in one
	// round trip. A due renewal may wait for the call then running (up to
	// OpTimeout) and take up to OpTimeout itself, all within the lease's
	// validity: RenewEvery+2*OpTimeout must be less than LeaseTTL less its
	// margin (a tenth of LeaseTTL), else New refuses the Config. Default
	// LeaseTTL/3, or, where a long OpTimeout leaves less room than that,
	// two thirds of the room.
	RenewEvery time.Duration

	// OpTimeout bounds every Redis call; one that takes longer counts as a
	// failure (see Mode). Default 500ms, or LeaseTTL/4 when that is less.
	OpTimeout time.Duration

	// RecheckEvery is how long a waiting request sleeps at most without a
	// notification before it asks again (notifications can be lost with a
	// connection; slots freed by expiry are never announced), and how often
	// a degraded limiter probes Redis at most. A degraded limiter renews
	// nothing until a probe succeeds; while it holds leases it probes more
	// often, at least every quarter of the time left on the soonest, so that
	// the leases are renewed soon after Redis answers again. The first probe
	// after a failed renewal (up to OpTimeout after it was due) must come
	// while the held leases are still valid: RenewEvery+OpTimeout+RecheckEvery
	// must be less than LeaseTTL less its margin (a tenth of LeaseTTL), else
	// New refuses the Config. Default 1 second, or half the room
	// that rule leaves when that is less.
	RecheckEvery time.Duration

	// Mode says what to do when Redis cannot be asked. Default FailOpen.
	Mode Mode

	// MinReplicas is how many replicas must confirm a take, a renewal or a
	// probe (Redis WAIT, within OpTimeout) before the limiter relies on it;
	// an unconfirmed one is a failure (ErrorReplication), handled as Mode
	// says. Replication is asynchronous: with 0, the default, a failover
	// can lose the leases written just before it, and the new master then
	// hands their slots out again. Set it to 1 behind Sentinel so that a
	// promoted replica has every lease in use. It needs a *redis.Client; a
	// *redis.ClusterClient is refused.
	MinReplicas int

	// ProcessID names this process in the lease members it writes, which is
	// what an operator sees in the sorted sets. It need not be unique: every
	// member also carries a random part chosen by New, so limiters given the
	// same ProcessID never share a member. Default: host name and process ID.
	ProcessID string

	// Logger receives the rare events worth a look: degraded and recovered,
	// leases found lost by a renewal. Default slog.Default().
	Logger *slog.Logger
}

const (
	defaultPrefix       = "tenantdb"
	defaultLeaseTTL     = 10 * time.Second
	defaultOpTimeout    = 500 * time.Millisecond
	defaultRecheckEvery = time.Second
)

func (c Config) withDefaults() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch c.Client.(type) {
	case nil:
		return bad("Client is nil")
	case *redis.Ring:
		return bad("a *redis.Ring is not supported: use a *redis.Client or *redis.ClusterClient")
	}
	if c.Prefix == "" {
		c.Prefix = defaultPrefix
	}
	if c.LeaseTTL < 0 || c.RenewEvery < 0 || c.OpTimeout < 0 || c.RecheckEvery < 0 {
		return bad("negative duration")
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = defaultLeaseTTL
	}
	if c.LeaseTTL < 10*time.Millisecond {
		return bad("LeaseTTL %v is below 10ms", c.LeaseTTL)
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = min(defaultOpTimeout, c.LeaseTTL/4)
	}
	if c.RenewEvery == 0 {
		// A third of the lease, less where a long OpTimeout leaves less
		// room for a delayed renewal (see the check below).
		c.RenewEvery = c.LeaseTTL / 3
		if room := c.LeaseTTL - margin(c) - 2*c.OpTimeout; c.RenewEvery >= room && room > 0 {
			c.RenewEvery = room * 2 / 3
		}
	}
	// A renewal falls due at most RenewEvery after the last one was sent,
	// may wait for the call then running, and is answered within
	// OpTimeout: the lease must stay valid that long (see RenewEvery).
	if c.RenewEvery+2*c.OpTimeout >= c.LeaseTTL-margin(c) {
		return bad("RenewEvery %v + 2*OpTimeout %v must be less than LeaseTTL %v less its margin %v: "+
			"a due renewal may wait for one call and then for its own answer", c.RenewEvery, c.OpTimeout, c.LeaseTTL, margin(c))
	}
	// A probe RecheckEvery after a failed renewal must still find the
	// leases valid, else a blip of Redis revokes them (see RecheckEvery).
	room := c.LeaseTTL - margin(c) - c.RenewEvery - c.OpTimeout
	if c.RecheckEvery == 0 {
		c.RecheckEvery = max(time.Millisecond, min(defaultRecheckEvery, room/2))
	}
	if c.RecheckEvery >= room {
		return bad("RecheckEvery %v is too long for LeaseTTL %v: a degraded limiter renews only after a probe, "+
			"so RenewEvery %v + OpTimeout %v + RecheckEvery must be less than LeaseTTL less its margin %v",
			c.RecheckEvery, c.LeaseTTL, c.RenewEvery, c.OpTimeout, margin(c))
	}
	if c.MinReplicas < 0 {
		return bad("MinReplicas %d is negative", c.MinReplicas)
	}
	if _, cluster := c.Client.(*redis.ClusterClient); cluster && c.MinReplicas > 0 {
		return bad("MinReplicas needs a *redis.Client: a *redis.ClusterClient routes WAIT to any node")
	}
	if c.Mode != FailOpen && c.Mode != FailClosed {
		return bad("unknown %v", c.Mode)
	}
	if c.ProcessID == "" {
		c.ProcessID = defaultProcessID()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// defaultProcessID is unique without coordination (the random part) and
// still tells an operator where a lease comes from.
func defaultProcessID() string {
	host, _ := os.Hostname()
	host = strings.ReplaceAll(host, ":", "_")
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
