package tenantdb

import (
	"errors"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/pool/poolhttp"
)

// WriteOverLimit turns an over-limit error into an HTTP response: if err is
// (or wraps) an *OverLimitError it writes what poolhttp.WriteError writes for
// it, 429 Too Many Requests with a Retry-After header in whole seconds
// (rounded up, at least 1), and reports true. Any other error is left to the
// caller: it writes nothing and reports false.
func WriteOverLimit(w http.ResponseWriter, err error) bool {
	var ole *OverLimitError
	if !errors.As(err, &ole) {
		return false
	}
	poolhttp.WriteError(w, err)
	return true
}

// HTTPStatus is the HTTP status for err, an error from any call of a Pool
// (200 for nil), so that a handler needs one branch for them all:
//   - *OverLimitError: 429 Too Many Requests (WriteError adds Retry-After);
//   - ErrNoTenant (none, empty, malformed, or Lookup refused it): 401;
//   - ErrClosed, ErrRevoked, ErrNoDatabase, ErrTooManyDatabases,
//     pool.ErrTooManyTenants, pool.ErrLookup, a failed connect, and the
//     server's own refusals (SQLSTATE classes 08 and 53, 57P01-57P03): 503
//     Service Unavailable, as these are the server's state, not the
//     tenant's usage (the two "too many" get Retry-After: 1 from WriteError);
//   - the call's context ended (waiting for a slot, a connection, the
//     database budget, or during the statement) or a statement_timeout
//     (57014): 504 Gateway Timeout for a deadline or timeout,
//     poolhttp.StatusClientClosedRequest (499) for a cancellation;
//   - anything else (a constraint violation, a syntax error, ErrUnknownClass,
//     ErrConnReleased): 500. Map the errors your handler expects (unique
//     violations, not found) before calling it.
func HTTPStatus(err error) int {
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	switch {
	case err == nil:
		return http.StatusOK
	case errors.Is(err, ErrOverLimit):
		return http.StatusTooManyRequests
	case errors.Is(err, ErrNoTenant), errors.Is(err, pool.ErrInvalidTenant):
		return http.StatusUnauthorized
	case errors.Is(err, ErrUnknownClass):
		return http.StatusInternalServerError
	case errors.Is(err, ErrClosed), errors.Is(err, ErrRevoked), errors.Is(err, ErrNoDatabase),
		errors.Is(err, ErrTooManyDatabases), errors.Is(err, pool.ErrTooManyTenants), errors.Is(err, pool.ErrLookup):
		return http.StatusServiceUnavailable
	case errors.As(err, &pgErr):
		switch {
		case pgErr.Code == "57014":
			return http.StatusGatewayTimeout
		case strings.HasPrefix(pgErr.Code, "08"), strings.HasPrefix(pgErr.Code, "53"),
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03":
			return http.StatusServiceUnavailable
		}
		return http.StatusInternalServerError
	}
	if status := poolhttp.HTTPStatus(err); status != http.StatusServiceUnavailable {
		return status // a context that ended
	}
	if errors.As(err, &connectErr) || pgconn.SafeToRetry(err) {
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// WriteError writes the response for err as HTTPStatus maps it, and returns
// the status: 429 with Retry-After (whole seconds, rounded up, at least 1)
// for an over-limit error, as WriteOverLimit does; 503 with Retry-After: 1
// for ErrTooManyDatabases and pool.ErrTooManyTenants; else a fixed body that
// holds none of err's text (hosts, queries, tenant IDs stay on the server).
// Log err yourself for a 500 or a 503.
func WriteError(w http.ResponseWriter, err error) int {
	status := HTTPStatus(err)
	switch {
	case status == http.StatusTooManyRequests:
		return poolhttp.WriteError(w, err)
	case errors.Is(err, ErrTooManyDatabases), errors.Is(err, pool.ErrTooManyTenants):
		w.Header().Set("Retry-After", "1")
	}
	text := strings.ToLower(http.StatusText(status))
	switch status {
	case poolhttp.StatusClientClosedRequest:
		text = "client closed request"
	case http.StatusUnauthorized:
		text = "unknown tenant"
	case http.StatusInternalServerError:
		text = "database error"
	}
	http.Error(w, text, status)
	return status
}
