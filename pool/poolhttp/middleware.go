package poolhttp

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

// Middleware admits every request against g for the tenant that tenant
// returns, and runs the next handler holding one of that tenant's slots. The
// slot is released when the handler returns, on every path: a panic
// (re-raised after the release, so net/http logs it or aborts the response as
// usual), a client that went away (the request's context is cancelled; the
// handler should watch it), or a normal return. The handler's request carries
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
//   - g is closed (pool.ErrClosed), too many tenants are tracked, the
//     request's context ended while it waited, or Config.Lookup failed: 503
//     Service Unavailable.
//
// The wait for a slot is bounded by the plan (MaxWaiting, MaxWait) and by
// the request's context: net/http cancels it when the client goes away.
// tenant is called once per request, from the request's goroutine; it should
// authenticate the caller (a verified token's claim, not a header a client
// may choose freely).
func Middleware(g *pool.Gate, tenant func(*http.Request) (string, error)) func(http.Handler) http.Handler {
	if g == nil || tenant == nil {
		panic("poolhttp: Middleware needs a Gate and a tenant func")
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id, err := tenant(r)
			if err != nil {
				http.Error(w, "no tenant: "+err.Error(), http.StatusUnauthorized)
				return
			}
			ctx := pool.WithTenant(r.Context(), id)
			permit, err := g.Acquire(ctx, id)
			if err != nil {
				WriteError(w, err)
				return
			}
			defer permit.Release() // runs before a panic goes on up to net/http
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

// WriteError writes the response Middleware gives a request that was not
// admitted because of err, an error from pool.Gate.Acquire: 429 with
// Retry-After for an over-limit error, 401 for an invalid tenant, 503 for
// anything else. It returns the status written.
func WriteError(w http.ResponseWriter, err error) int {
	var ole *pool.OverLimitError
	switch {
	case errors.As(err, &ole):
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds(ole.RetryAfter)))
		http.Error(w, "too many concurrent requests for this tenant; retry later", http.StatusTooManyRequests)
		return http.StatusTooManyRequests
	case errors.Is(err, pool.ErrInvalidTenant):
		http.Error(w, "invalid tenant", http.StatusUnauthorized)
		return http.StatusUnauthorized
	default:
		http.Error(w, "service unavailable", http.StatusServiceUnavailable)
		return http.StatusServiceUnavailable
	}
}

// RetryAfterSeconds rounds d up to whole seconds, at least 1, as the HTTP
// Retry-After header wants it.
func RetryAfterSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}
