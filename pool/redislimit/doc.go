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
// to someone else); it counts it in Stats.LostLeases and logs it.
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
// A request never waits for Redis longer than OpTimeout per call, even when
// the client ignores contexts (background calls use the client's own
// timeouts then; set ContextTimeoutEnabled to have OpTimeout bound them too).
// The first failed call marks the limiter degraded: from then on requests do
// not wait for Redis but follow Config.Mode at once, until a background probe
// (every RecheckEvery) succeeds. With FailOpen (the default) a request gets a
// lease whose Local reports true, so only the process's own limits apply; with
// FailClosed it gets an error matching ErrUnavailable. Recovery leaks nothing:
// local leases never touch Redis, a release that failed is retried until the
// lease would have expired anyway, and a take whose outcome is unknown (it
// timed out, or its caller gave up) is released as soon as Redis answers.
// Redis restarted without persistence forgets every lease; renewals then count
// them as lost, and for as long as those requests still run a tenant may hold
// up to twice its cap.
//
// # Keys
//
// All keys of a tenant share one Redis Cluster hash slot: they are
// "{<Prefix>:<tenant>}:slots" (the sorted set) and "{<Prefix>:<tenant>}:waiting"
// (the waiter mark); the channel is "{<Prefix>:<tenant>}:free". Every key
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
