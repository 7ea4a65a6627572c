package tenantdb

import (
	"errors"

	"github.com/tenantdb/tenantdb/pool"
)

var (
	// ErrOverLimit is matched by every *OverLimitError: the tenant was at its
	// cap and its queue was full, or it waited its plan's MaxWait.
	ErrOverLimit = pool.ErrOverLimit

	// ErrClosed is returned by every call after Close.
	ErrClosed = pool.ErrClosed

	// ErrUnknownClass is returned (wrapped) by a call whose context names a
	// class (WithClass) that is not one of Config.Classes, or a malformed one.
	ErrUnknownClass = pool.ErrUnknownClass
)

// OverLimitError reports a request refused because its tenant is at its cap.
// Its Tenant, Limit and RetryAfter fields say who, at what cap and when to come
// back; WriteOverLimit turns it into HTTP 429 with Retry-After.
type OverLimitError = pool.OverLimitError

// ErrConnReleased is returned by every use of a Conn after its Release (or
// Hijack), of any copy of it, and of the Tx, Rows, Row and BatchResults it
// handed out: the connection may be another holder's by then. The zero
// Conn returns it too.
var ErrConnReleased = errors.New("tenantdb: the Conn was released")
