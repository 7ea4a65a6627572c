package tenantdb

import (
	"errors"
	"net/http"
	"strconv"
	"time"
)

// WriteOverLimit turns an over-limit error into an HTTP response: if err is
// (or wraps) an *OverLimitError it writes 429 Too Many Requests with a
// Retry-After header in whole seconds (rounded up, at least 1) and reports
// true. Any other error is left to the caller: it writes nothing and reports
// false.
func WriteOverLimit(w http.ResponseWriter, err error) bool {
	var ole *OverLimitError
	if !errors.As(err, &ole) {
		return false
	}
	w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds(ole.RetryAfter)))
	http.Error(w, "too many concurrent requests for this tenant; retry later", http.StatusTooManyRequests)
	return true
}

// RetryAfterSeconds rounds d up to whole seconds, at least 1, as the HTTP
// Retry-After header wants it.
func RetryAfterSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}
