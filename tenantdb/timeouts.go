package tenantdb

import (
	"errors"

	"github.com/tenantdb/tenantdb/pool"
)

// check is guard.wrap for the error of a statement on h's connection, and
// counts a statement timeout in the tenant's stats (pool.Permit.Exceeded).
func (h *held) check(err error) error {
	err = h.guard.wrap(err)
	countStatementTimeout(h.permit, err)
	return err
}

// countStatementTimeout counts err in p's tenant's stats if it is a
// statement cancelled for p's StatementTimeout. p is held, or zero (a held
// released already): its time limits are read only while it is held.
func countStatementTimeout(p pool.Permit, err error) {
	if err != nil && errors.Is(statementTimedOut(err), ErrStatementTimeout) && p.StatementTimeout() > 0 {
		p.Exceeded(pool.LimitStatement)
	}
}
