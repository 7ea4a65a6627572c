// Package redislimit keeps each tenant's connection cap across all the
// processes that share it, in Redis. It implements pool.ClusterLimiter: set
// a *Limiter as tenantdb.Config.Cluster (or pool.Config.Cluster), and a
// tenant's plan cap becomes a cap for the whole cluster instead of one per
// process.
//
// # Slots are leases
//
// A tenant's slots are the members of one sorted set, scored by when each
// lease expires on Redis's own clock (TIME inside the scripts, so the
// processes' clocks never matter). Taking a slot is one Lua script: drop the
// expired members, and add one if fewer than the limit remain. Releasing is
// another: remove the member. A process renews all of its leases in the
// background, every RenewEvery, with one script call per tenant pipelined
// into one round trip, so that a live process never loses a slot it holds
// while the slots of a process that died come back within LeaseTTL. A
// renewal never re-adds a lease it finds gone (Redis may have given its slot
// to someone else); it counts it in Stats.LostLeases and logs it. A renewal
// that falls due while a flush of releases (or any other call) runs waits
// for that call only, and then goes first, so it is answered within
// 2*OpTimeout of being due: New requires RenewEvery+2*OpTimeout to be less
// than the lease's validity (below).
//
// # Lost leases are revoked
//
// Each lease is valid locally until the send time of the last take or
// renewal Redis confirmed, plus LeaseTTL, less a margin (a tenth of LeaseTTL, for clock drift and
// for the holder to stop its work):
// Redis cannot have expired it before then. When that time passes without a
// confirmed renewal (the process was cut off from Redis, paused by the OS or
// a long GC, Redis hung or failed over), or a renewal finds the lease gone,
// the lease is revoked on this process's clock alone, whether or not Redis
// answers. In FailClosed mode its Revoked channel (pool.ClusterLease) is
// closed: tenantdb then cancels the query that holds it. In FailOpen mode the
// request runs on and the lease turns local, then is put back in Redis under
// a new member at the next renewal, so that Redis counts what runs.
//
// Lease members are ProcessID#instance.n, the instance part random per
// Limiter, and the take script adds them with ZADD NX: limiters given the
// same ProcessID never merge their leases into one.
//
// # The local gate stays in front
//
// The pool's Gate asks for a cluster slot only after a request got one of its
// tenant's local slots, so a process never asks Redis for more than its own
// share allows, and a request waiting for the cluster holds no shared
// connection.
//
// # Waiting is woken by Redis, not by polling
//
// A request that finds its tenant's slots all taken, and may wait, subscribes
// (once per tenant per process) to the tenant's channel and marks the tenant
// as having waiters with a short-lived key. A release that finds the mark
// publishes how many slots it freed, and each process wakes that many of its
// waiters, oldest first. While waiters are marked, a new request queues
// behind them instead of taking a freed slot first (if a slot is free it
// tries again after two round trips, as the mark may outlive the waiters),
// so that a busy process, whose release and next take could otherwise keep
// a slot to itself, cannot starve the others. A waiter also re-checks every
// RecheckEvery, or when the soonest lease would expire, for notifications
// lost with a connection and for slots freed by expiry.
//
// # When Redis is unavailable or slow
//
// A request never waits for Redis longer than OpTimeout per call, and
// neither do the background renewals, flushes and probes, even when the
// client ignores contexts: each runs in a goroutine of its own that the
// limiter stops waiting for after OpTimeout (set ContextTimeoutEnabled to
// have the client also stop waiting on the socket at once).
// The first failed call marks the limiter degraded: from then on requests do
// not wait for Redis but follow Config.Mode at once, until it recovers. With
// FailOpen (the default) a request gets a lease whose Local reports true, so
// only the process's own limits apply; with FailClosed it gets an error
// matching ErrUnavailable. Failures are classified (Stats.ErrorsByKind):
// timeouts, network errors, OOM (Redis refuses writes yet answers PING),
// READONLY (a replica, during a failover), script errors, cluster errors,
// writes the replicas did not confirm (Config.MinReplicas).
//
// Recovery is a reconcile, tried every RecheckEvery while degraded, and more
// often while leases are held (at least every quarter of the time left
// before the soonest one's validity ends), so that a Redis that answers
// again renews them before they lapse: a probe that
// writes (PING would succeed under OOM and make the limiter flap), then the
// renewal of the leases still held and the assertion in Redis of the
// fail-open grants still held, then the flush of releases; only then is the
// limiter healthy and do takes run again. A take drops expired leases, so
// marking it healthy first would let one purge the leases of requests still
// running and hand their slots out twice. Recovery leaks nothing: a release
// that failed is retried until the lease would have expired anyway, and a
// take whose outcome is unknown (it timed out, or its caller gave up) is
// released as soon as Redis answers. Redis restarted without persistence
// forgets every lease; renewals then find them lost (see above).
//
// Replication is asynchronous: a failover may promote a replica that lacks
// the leases written just before it, and the new master would hand their
// slots out again. Config.MinReplicas makes every take, renewal and probe
// wait (WAIT) for that many replicas to confirm it, or fail
// (ErrorReplication); behind Sentinel set it to 1 and run two replicas.
//
// Redis must not evict the limiter's keys: set maxmemory-policy noeviction
// (the default), so that a full Redis refuses writes instead of dropping a
// tenant's leases. Limiter.CheckEviction checks it; the limiter logs a
// warning once if it fails.
//
// # Keys
//
// All keys of a tenant share one Redis Cluster hash slot: they are
// "{<Prefix>:<tenant>}:slots" (the sorted set) and "{<Prefix>:<tenant>}:waiting"
// (the waiter mark); the channel is "{<Prefix>:<tenant>}:free", where <tenant>
// has '%' and ':' escaped as "%25" and "%3A", so that deployments whose
// prefixes differ never share a key. Every key
// expires: the sorted set a while after its newest lease would expire
// (and at once when its last lease is released), the mark a few RecheckEvery
// after the last waiter's attempt, so idle tenants leave nothing behind.
//
// Limiter.InUse counts a tenant's slots held across the cluster, and
// Limiter.SlotsKey names the sorted set, whose members say which process
// holds each slot.
//
// It needs Redis 5 or later (scripts read the server's clock, which needs
// effects replication) and a *redis.Client (standalone or Sentinel failover)
// or *redis.ClusterClient; a *redis.Ring cannot subscribe without a channel
// and is rejected.
package redislimit
