package redislimit

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrorKind classifies a failed Redis call, for Stats.ErrorsByKind and the
// log: the kinds call for different remedies.
type ErrorKind int

const (
	// ErrorOther is any other failure.
	ErrorOther ErrorKind = iota
	// ErrorTimeout: no answer within OpTimeout (Redis paused, overloaded,
	// or a network partition).
	ErrorTimeout
	// ErrorNetwork: the connection failed (Redis down, refused, reset).
	ErrorNetwork
	// ErrorOOM: Redis answers but refuses writes, over its maxmemory with
	// maxmemory-policy noeviction. Reads (PING) still succeed, which is why
	// the limiter probes with a write.
	ErrorOOM
	// ErrorReadOnly: the node is a replica (READONLY), typically for a
	// moment during a failover until the client finds the new master.
	ErrorReadOnly
	// ErrorScript: Redis could not run a script (a script error, scripting
	// disabled, or a server too old). Unlike the others, it does not go
	// away by waiting: it is logged as an error.
	ErrorScript
	// ErrorCluster: the cluster could not serve the key (CLUSTERDOWN,
	// TRYAGAIN, or MOVED/ASK the client did not follow).
	ErrorCluster
	// ErrorReplication: fewer than Config.MinReplicas replicas confirmed a
	// write in time (a replica down or lagging, or this master demoted by a
	// failover).
	ErrorReplication

	numErrorKinds = iota
)

func (k ErrorKind) String() string {
	switch k {
	case ErrorTimeout:
		return "timeout"
	case ErrorNetwork:
		return "network"
	case ErrorOOM:
		return "oom"
	case ErrorReadOnly:
		return "readonly"
	case ErrorScript:
		return "script"
	case ErrorCluster:
		return "cluster"
	case ErrorReplication:
		return "replication"
	default:
		return "other"
	}
}

// errTimedOut is the failure of a call that did not answer within OpTimeout.
var errTimedOut = errors.New("no answer within OpTimeout")

// errNotReplicated is the failure of a write that fewer than
// Config.MinReplicas replicas confirmed within OpTimeout.
var errNotReplicated = errors.New("write not confirmed by enough replicas")

// classify returns the kind of a failed call's error.
func classify(err error) ErrorKind {
	var ne net.Error
	switch {
	case errors.Is(err, errNotReplicated):
		return ErrorReplication
	case errors.Is(err, errTimedOut), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return ErrorTimeout
	case redis.HasErrorPrefix(err, "OOM"):
		return ErrorOOM
	case redis.HasErrorPrefix(err, "READONLY"):
		return ErrorReadOnly
	case strings.Contains(err.Error(), "non local key"):
		// A script met a key whose slot moved away while it ran (a slot
		// migration): the cluster's doing, not the script's.
		return ErrorCluster
	case redis.HasErrorPrefix(err, "NOSCRIPT"), isScriptError(err):
		return ErrorScript
	case redis.HasErrorPrefix(err, "CLUSTERDOWN"), redis.HasErrorPrefix(err, "TRYAGAIN"),
		redis.HasErrorPrefix(err, "MOVED"), redis.HasErrorPrefix(err, "ASK"):
		return ErrorCluster
	case errors.As(err, &ne), errors.Is(err, net.ErrClosed), errors.Is(err, redis.ErrClosed),
		strings.Contains(err.Error(), "connection refused"), strings.Contains(err.Error(), "EOF"):
		return ErrorNetwork
	}
	return ErrorOther
}

// isScriptError reports an error raised while running a script. Redis
// reports OOM and READONLY met by a command inside a script with the
// command's own prefix, so those are classified first.
func isScriptError(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "user_script") || strings.Contains(msg, "Error running script") ||
		strings.HasPrefix(msg, "ERR") && strings.Contains(msg, "script") ||
		redis.HasErrorPrefix(err, "DUPMEMBER")
}
