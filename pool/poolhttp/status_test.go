package poolhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/pool/poolhttp"
)

// TestHTTPStatusOfEveryAcquireError maps each error a Gate's Acquire
// returns, made by a real Gate: a context that ended while waiting is 504
// or 499, while a Lookup that failed with its own deadline is 503.
func TestHTTPStatusOfEveryAcquireError(t *testing.T) {
	g := newGate(t, pool.Config{Capacity: 2, Plans: map[string]pool.Plan{"p": {MaxConns: 1, MaxWaiting: 2, MaxWait: time.Minute}},
		Lookup: func(_ context.Context, id string) (pool.Tenant, error) {
			if id == "slow-store" {
				return pool.Tenant{}, fmt.Errorf("query tenants: %w", context.DeadlineExceeded)
			}
			return pool.Tenant{}, nil
		}})
	held, err := g.Acquire(context.Background(), "busy")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	deadline, stop := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer stop()
	_, waitDeadline := g.Acquire(deadline, "busy")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	_, arrivedCancelled := g.Acquire(cancelled, "busy")
	_, lookup := g.Acquire(context.Background(), "slow-store")
	_, invalid := g.Acquire(context.Background(), "")
	_, class := g.Acquire(pool.WithClass(context.Background(), "nope"), "busy")
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, http.StatusOK},
		{"deadline while waiting", waitDeadline, http.StatusGatewayTimeout},
		{"cancelled", arrivedCancelled, poolhttp.StatusClientClosedRequest},
		{"lookup's own deadline", lookup, http.StatusServiceUnavailable},
		{"invalid tenant", invalid, http.StatusUnauthorized},
		{"unknown class", class, http.StatusInternalServerError},
		{"closed", pool.ErrClosed, http.StatusServiceUnavailable},
		{"too many tenants", fmt.Errorf("x: %w", pool.ErrTooManyTenants), http.StatusServiceUnavailable},
	} {
		if got := poolhttp.HTTPStatus(tc.err); got != tc.want {
			t.Errorf("%s: HTTPStatus(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
	var we *pool.WaitError
	if !errors.As(waitDeadline, &we) || !errors.Is(lookup, pool.ErrLookup) {
		t.Errorf("errors not as expected: %v; %v", waitDeadline, lookup)
	}
	rec := httptest.NewRecorder()
	if poolhttp.WriteError(rec, fmt.Errorf("x: %w", pool.ErrTooManyTenants)); rec.Header().Get("Retry-After") != "1" {
		t.Errorf("too many tenants: Retry-After %q, want 1", rec.Header().Get("Retry-After"))
	}
}
