package redislimit

import (
	"errors"
	"fmt"

	"github.com/tenantdb/tenantdb/pool"
)

var (
	// ErrUnavailable is matched by the errors AcquireSlot returns in
	// FailClosed mode when Redis could not be asked in time, or the limiter
	// is degraded after an earlier failure. The error also wraps the failure.
	ErrUnavailable = errors.New("redislimit: redis unavailable")

	// ErrClosed is returned by AcquireSlot after Close, and to requests that
	// were waiting when Close was called. errors.Is(ErrClosed, pool.ErrClosed)
	// holds.
	ErrClosed = fmt.Errorf("redislimit: limiter closed: %w", pool.ErrClosed)

	// ErrInvalidConfig wraps every configuration error from New.
	ErrInvalidConfig = errors.New("redislimit: invalid config")
)

// overLimit is the error for a tenant whose cluster-wide slots are all held;
// the Gate turns it into a *pool.OverLimitError.
func overLimit(tenant string, held, limit int, waited bool) error {
	if waited {
		return fmt.Errorf("redislimit: tenant %q: all %d cluster slots still held after waiting: %w", tenant, limit, pool.ErrOverLimit)
	}
	return fmt.Errorf("redislimit: tenant %q: %d of %d cluster slots held: %w", tenant, held, limit, pool.ErrOverLimit)
}
