package redislimit

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Scripts read the time with TIME so that every expiry is on Redis's clock:
// the processes' clocks may disagree, Redis's is the one every script sees.
// Times are in milliseconds.

// takeScript takes one slot, after removing this process's released leases
// of the tenant that are still waiting to be flushed (so a release is seen by
// the next take of the same process, as if it had been synchronous) and the
// leases that expired.
//
// KEYS: slots, waiting. ARGV: member, limit, lease TTL, key TTL, mode,
// waiting-mark TTL, channel, members to release first....
// Modes: "0" take if free; "1" take if free and nobody waits (a new request
// queues behind waiters rather than barging past them); "2" take if free (a
// waiter). Modes 1 and 2 mark the tenant as having waiters when they fail.
// Returns {took (0/1), slots held afterwards, ms until the soonest lease
// expires (-1 if none or took)}. A member that is already there is never
// overwritten (that would merge two leases into one slot): the script fails
// with DUPMEMBER instead, which unique members make impossible.
var takeScript = redis.NewScript(luaNow + `
local freed = 0
if #ARGV > 7 then
  freed = redis.call('ZREM', KEYS[1], unpack(ARGV, 8))
end
freed = freed + redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
local mode = ARGV[5]
local waiting = redis.call('EXISTS', KEYS[2]) == 1
local took = 0
if n < tonumber(ARGV[2]) and not (mode == '1' and waiting) then
  if redis.call('ZADD', KEYS[1], 'NX', now + tonumber(ARGV[3]), ARGV[1]) == 0 then
    return redis.error_reply('DUPMEMBER lease member already in use: ' .. ARGV[1])
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  took = 1
  n = n + 1
  freed = freed - 1
elseif mode ~= '0' then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[6])
  waiting = true
end
if freed > 0 and waiting then
  redis.call('PUBLISH', ARGV[7], freed)
end
local soonest = -1
if took == 0 and n > 0 then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  soonest = math.max(0, tonumber(first[2]) - now)
end
return {took, n, soonest}
`)

// releaseScript removes released leases and, when some process has waiters,
// tells them how many slots were freed.
//
// KEYS: slots, waiting. ARGV: channel, members....
// Returns the number of members removed.
var releaseScript = redis.NewScript(`
local freed = redis.call('ZREM', KEYS[1], unpack(ARGV, 2))
if freed > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[1], freed)
end
return freed
`)

// renewScript extends held leases and the key's own expiry. A member that is
// gone is reported, never re-added: its slot may have been taken since. A
// member that expired but is still there is renewed: no take has run since it
// expired (a take first drops expired members), so nobody counted its slot
// as free.
//
// KEYS: slots. ARGV: lease TTL, key TTL, members....
// Returns the 0-based indexes (among the members) of the lost ones.
var renewScript = redis.NewScript(luaNow + `
local exp = now + tonumber(ARGV[1])
local lost = {}
for i = 3, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', exp, ARGV[i])
  else
    lost[#lost + 1] = i - 3
  end
end
if #lost < #ARGV - 2 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return lost
`)

// assertScript adds leases granted locally during an outage (FailOpen) that
// are still held, whatever the limit: the requests run, and Redis must count
// them so that other processes do not hand out their slots too.
//
// KEYS: slots. ARGV: lease TTL, key TTL, members....
// Returns the number added.
var assertScript = redis.NewScript(luaNow + `
local exp = now + tonumber(ARGV[1])
local added = 0
for i = 3, #ARGV do
  added = added + redis.call('ZADD', KEYS[1], 'NX', exp, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return added
`)

// probeScript writes a short-lived key: a probe must find out whether Redis
// takes writes (it may answer PING yet refuse writes: OOM, READONLY) and
// runs scripts.
//
// KEYS: the probe key. Returns 1.
var probeScript = redis.NewScript(`
redis.call('SET', KEYS[1], '1', 'PX', 1000)
return 1
`)

// inUseScript counts the leases that have not expired.
//
// KEYS: slots. Returns the count.
var inUseScript = redis.NewScript(luaNow + `
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
`)

// luaNow starts the scripts that need the time: now, in ms, from Redis's
// own clock, so that every process measures lease expiry against one clock.
const luaNow = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`

// maxMembersPerCall bounds the members one script call carries, to keep
// each call short: Redis runs scripts one at a time.
const maxMembersPerCall = 256

// scriptCall is one script invocation in a pipeline.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
}

// run runs one script: EVALSHA, and EVAL when Redis does not know the
// script (first use, or after a restart). With confirm, a write must be
// confirmed by Config.MinReplicas replicas (see runPipelined). It returns
// the round trips made.
func (l *Limiter) run(ctx context.Context, s *redis.Script, confirm bool, keys []string, args ...any) (*redis.Cmd, int) {
	if confirm && l.cfg.MinReplicas > 0 {
		c := &scriptCall{script: s, keys: keys, args: args}
		rt := l.runPipelined(ctx, []*scriptCall{c}, true)
		return c.cmd, rt
	}
	cmd := s.EvalSha(ctx, l.client, keys, args...)
	if !isNoScript(cmd.Err()) {
		return cmd, 1
	}
	return s.Eval(ctx, l.client, keys, args...), 2
}

// runPipelined runs calls in one pipeline (one round trip per node), again
// with EVAL for those that met NOSCRIPT. With confirm and
// Config.MinReplicas set, each pipeline ends with WAIT, and the calls it
// does not confirm fail with errNotReplicated: replication is asynchronous,
// and a failover would lose what no replica has. It returns the round trips
// made. Each call's outcome is in its cmd.
func (l *Limiter) runPipelined(ctx context.Context, calls []*scriptCall, confirm bool) int {
	if len(calls) == 0 {
		return 0
	}
	wait := confirm && l.cfg.MinReplicas > 0
	pipe := l.client.Pipeline()
	for _, c := range calls {
		c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	l.execConfirmed(ctx, pipe, calls, wait)
	var again []*scriptCall
	for _, c := range calls {
		if isNoScript(c.cmd.Err()) {
			again = append(again, c)
		}
	}
	if len(again) == 0 {
		return 1
	}
	pipe = l.client.Pipeline()
	for _, c := range again {
		c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
	}
	l.execConfirmed(ctx, pipe, again, wait)
	return 2
}

// execConfirmed runs pipe, which holds calls, followed by WAIT when wait is
// set; WAIT covers the writes made before it on the pipeline's connection.
// WAIT gives up after half of OpTimeout, so that its answer, not the
// call's timeout, says why a call failed.
// A call that succeeded but was not confirmed gets WAIT's error, or
// errNotReplicated.
func (l *Limiter) execConfirmed(ctx context.Context, pipe redis.Pipeliner, calls []*scriptCall, wait bool) {
	var w *redis.Cmd
	if wait {
		w = pipe.Do(ctx, "wait", l.cfg.MinReplicas, max(1, l.cfg.OpTimeout.Milliseconds()/2))
	}
	_, _ = pipe.Exec(ctx) // errors are in the cmds
	if w == nil {
		return
	}
	n, err := w.Int64()
	if err == nil && n < int64(l.cfg.MinReplicas) {
		err = fmt.Errorf("%w: %d of %d", errNotReplicated, n, l.cfg.MinReplicas)
	}
	if err == nil {
		return
	}
	for _, c := range calls {
		if c.cmd.Err() == nil {
			c.cmd.SetErr(err)
		}
	}
}

func isNoScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }

// takeResult is takeScript's answer.
type takeResult struct {
	took    bool
	held    int
	soonest int64         // ms until the soonest lease expires, -1 if unknown
	rtt     time.Duration // how long the call took
}

func parseTake(cmd *redis.Cmd) (takeResult, error) {
	v, err := cmd.Int64Slice()
	if err != nil {
		return takeResult{}, err
	}
	if len(v) != 3 {
		return takeResult{}, fmt.Errorf("redislimit: unexpected take reply %v", v)
	}
	return takeResult{took: v[0] == 1, held: int(v[1]), soonest: v[2]}, nil
}

// memberCalls appends to calls one call of script per run of at most
// maxMembersPerCall items, with keys and the arguments lead followed by the
// items' members, and hands each run to chunk in the same order.
func memberCalls[T any](calls []*scriptCall, script *redis.Script, keys []string, lead []any, items []T,
	member func(T) string, chunk func([]T)) []*scriptCall {
	for len(items) > 0 {
		n := min(len(items), maxMembersPerCall)
		args := make([]any, 0, len(lead)+n)
		args = append(args, lead...)
		for _, it := range items[:n] {
			args = append(args, member(it))
		}
		calls = append(calls, &scriptCall{script: script, keys: keys, args: args})
		chunk(items[:n])
		items = items[n:]
	}
	return calls
}
