package poolhttp

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

// Middleware admits every request against g for the tenant that tenant
// returns, and runs the next handler holding one of that tenant's slots. The
// slot is released when the handler returns, on every path: a panic
// (re-raised after the release, so net/http logs it or aborts the response as
// usual), a client that went away (the request's context is cancelled; the
// handler should watch it), or a normal return. A handler that hijacks the
// connection (a websocket) hands the slot to it: it is released when the
// hijacked net.Conn is closed, so such sessions count against the tenant's
// cap for as long as they last. The handler's request carries
// the tenant (pool.TenantFrom, tenantdb.TenantFrom), so calls made with
// r.Context() need no second WithTenant.
//
// Requests that are not admitted never reach the handler:
//   - tenant returns an error, or an ID the Gate refuses (empty, too long,
//     malformed: pool.ErrInvalidTenant): 401 Unauthorized;
//   - the tenant is at its cap and its plan's queue is full, or it waited the
//     plan's MaxWait (*pool.OverLimitError): 429 Too Many Requests with a
//     Retry-After header in whole seconds, rounded up from
//     OverLimitError.RetryAfter, at least 1;
//   - g is closed (pool.ErrClosed), too many tenants are tracked, or
//     Config.Lookup failed: 503 Service Unavailable;
//   - the request's context ended while it waited: 504 for a deadline, 499
//     for a client that went away (see HTTPStatus, which maps them all).
//
// The wait for a slot is bounded by the plan (MaxWaiting, MaxWait) and by
// the request's context: net/http cancels it when the client goes away.
// tenant is called once per request, from the request's goroutine; it should
// authenticate the caller (a verified token's claim, not a header a client
// may choose freely).
//
// A request is admitted as work of the class its context carries
// (pool.WithClass, set by an outer middleware), or of the class that the
// ClassOf option gives its route; the handler's request carries it on, so
// the database calls made with r.Context() are of that class too.
func Middleware(g *pool.Gate, tenant func(*http.Request) (string, error), opts ...Option) func(http.Handler) http.Handler {
	if g == nil || tenant == nil {
		panic("poolhttp: Middleware needs a Gate and a tenant func")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if o.skip != nil && o.skip(r) {
				next.ServeHTTP(w, r)
				return
			}
			id, err := tenant(r)
			if err != nil {
				http.Error(w, "no tenant: "+err.Error(), http.StatusUnauthorized)
				return
			}
			ctx := pool.WithTenant(r.Context(), id)
			if o.classOf != nil {
				if class := o.classOf(r); class != "" {
					ctx = pool.WithClass(ctx, class)
				}
			}
			permit, err := g.Acquire(ctx, id)
			if err != nil {
				WriteError(w, err)
				return
			}
			w, hj := trackHijack(w, permit.Release)
			defer func() { // runs before a panic goes on up to net/http
				if hj == nil || !hj.hijacked {
					permit.Release()
				}
			}()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

// Option configures Middleware.
type Option func(*options)

type options struct {
	classOf func(*http.Request) string
	skip    func(*http.Request) bool
}

// Skip makes Middleware pass the requests for which skip returns true
// (health checks, metrics: by r.URL.Path) straight to the next handler,
// unadmitted and without a tenant, as go-grpc-middleware's selector does.
func Skip(skip func(r *http.Request) bool) Option {
	return func(o *options) { o.skip = skip }
}

// ClassOf makes Middleware admit each request as work of the class that
// classOf returns for it (one of the Gate's Config.Classes), such as
// "batch" for an import endpoint: by r.Pattern when Middleware wraps each
// route's handler, by r.URL.Path when it wraps a whole mux. An empty result
// keeps the request's class (the default class unless an outer middleware
// set one). A class the Gate does not have fails the request with 500.
func ClassOf(classOf func(r *http.Request) string) Option {
	return func(o *options) { o.classOf = classOf }
}

// StatusClientClosedRequest is the status HTTPStatus gives a request whose
// client went away (its context was cancelled): 499, nginx's convention.
// The client never reads it; it is for access logs and metrics.
const StatusClientClosedRequest = 499

// HTTPStatus is the HTTP status for err, an error from pool.Gate.Acquire
// (200 for nil). It is the one mapping Middleware and WriteError use:
//   - *pool.OverLimitError: 429 Too Many Requests (WriteError adds Retry-After);
//   - pool.ErrNoTenant, pool.ErrInvalidTenant: 401 Unauthorized;
//   - pool.ErrUnknownClass: 500, a route mapped to a class the Gate lacks;
//   - pool.ErrLookup (Config.Lookup failed, whatever it wrapped), pool.ErrClosed,
//     pool.ErrTooManyTenants and anything else: 503 Service Unavailable;
//   - the request's context ended while it waited (*pool.WaitError, or
//     ended before it arrived): 504 Gateway Timeout for a deadline,
//     StatusClientClosedRequest (499) for a cancellation.
func HTTPStatus(err error) int {
	var ole *pool.OverLimitError
	switch {
	case err == nil:
		return http.StatusOK
	case errors.As(err, &ole):
		return http.StatusTooManyRequests
	case errors.Is(err, pool.ErrInvalidTenant), errors.Is(err, pool.ErrNoTenant):
		return http.StatusUnauthorized
	case errors.Is(err, pool.ErrUnknownClass):
		return http.StatusInternalServerError
	case errors.Is(err, pool.ErrLookup):
		return http.StatusServiceUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	case errors.Is(err, context.Canceled):
		return StatusClientClosedRequest
	default:
		return http.StatusServiceUnavailable
	}
}

// WriteError writes the response for err as HTTPStatus maps it, and returns
// the status written: 429 with a Retry-After header in whole seconds
// (RetryAfterSeconds) for an over-limit error, 503 with Retry-After: 1 for
// pool.ErrTooManyTenants, and a fixed body that holds none of err's text
// (what Lookup failed with stays on the server).
func WriteError(w http.ResponseWriter, err error) int {
	status := HTTPStatus(err)
	var ole *pool.OverLimitError
	switch {
	case errors.As(err, &ole):
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds(ole.RetryAfter)))
		http.Error(w, "too many concurrent requests for this tenant; retry later", status)
		return status
	case errors.Is(err, pool.ErrTooManyTenants):
		w.Header().Set("Retry-After", "1")
	}
	http.Error(w, statusText(status), status)
	return status
}

// statusText is http.StatusText, lower-cased, with "client closed request"
// for StatusClientClosedRequest and "invalid tenant" for 401.
func statusText(status int) string {
	switch status {
	case StatusClientClosedRequest:
		return "client closed request"
	case http.StatusUnauthorized:
		return "invalid tenant"
	}
	return strings.ToLower(http.StatusText(status))
}

// RetryAfterSeconds rounds d up to whole seconds, at least 1, as the HTTP
// Retry-After header wants it.
func RetryAfterSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}
