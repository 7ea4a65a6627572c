package tenantdb_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb"
)

func TestWriteOverLimit(t *testing.T) {
	for _, tc := range []struct {
		retryAfter time.Duration
		want       string
	}{
		{time.Millisecond, "1"},
		{time.Second, "1"},
		{1001 * time.Millisecond, "2"},
		{29*time.Second + time.Nanosecond, "30"},
	} {
		rec := httptest.NewRecorder()
		err := fmt.Errorf("handler: %w", &tenantdb.OverLimitError{Tenant: "acme", Limit: 2, RetryAfter: tc.retryAfter})
		if !tenantdb.WriteOverLimit(rec, err) {
			t.Fatalf("%v: not written", tc.retryAfter)
		}
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != tc.want {
			t.Fatalf("RetryAfter %v: status %d, Retry-After %q; want 429, %q",
				tc.retryAfter, rec.Code, rec.Header().Get("Retry-After"), tc.want)
		}
	}
	rec := httptest.NewRecorder()
	if tenantdb.WriteOverLimit(rec, errors.New("connection refused")) || rec.Code != http.StatusOK || rec.Body.Len() != 0 {
		t.Fatal("another error was written")
	}
	if tenantdb.WriteOverLimit(rec, nil) {
		t.Fatal("nil error was written")
	}
}
