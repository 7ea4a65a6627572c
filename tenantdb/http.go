package tenantdb

import (
	"errors"
	"net/http"

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
