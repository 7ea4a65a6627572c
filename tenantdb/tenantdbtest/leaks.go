package tenantdbtest

import "go.uber.org/goleak"

// FindLeaks reports goroutines still running when a test binary's tests are
// done, as goleak.Find does, but for the Docker client's idle HTTP
// connections to the engine, which testcontainers keeps open on purpose. Call
// it from TestMain after m.Run and after terminating shared containers.
// Only goroutines with a net/http persistConn loop on their stack are passed
// over: a leaked reader of any other connection (a pool's, a Redis
// subscription's) is still reported.
func FindLeaks(opts ...goleak.Option) error {
	return goleak.Find(append(opts,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	)...)
}
