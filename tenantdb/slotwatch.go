package tenantdb

// SlotWatch puts the work of a Slot under its tenant's
// IdleInTransactionTimeout and MaxHold, as a Conn from Acquire is: for an
// adapter (such as tenantsql) that runs the slot's work on the connection
// itself. The adapter brackets each of its calls on the connection with
// Enter and Leave (rows count as a call until they are closed), and Claims
// the hold before it gives the connection back itself. The watch ends the
// hold only while no call is in progress: it rolls back a transaction left
// open and gives the connection and the slot back with the adapter's give;
// from then on Enter and Claim fail with ErrIdleInTransaction or
// ErrMaxHold. A nil *SlotWatch (a slot without these limits) does nothing.
type SlotWatch struct{ w *holdWatch }

// Watch starts the slot's SlotWatch over the attached connection (Attach),
// or returns nil when the slot's tenant has neither an
// IdleInTransactionTimeout nor a MaxHold. give gives the connection and the
// slot back as the adapter does (Detach, Return, Release); closedErr is
// what a call after the hold ended fails with, besides the limit's error.
// Call it once, after Attach.
func (s *Slot) Watch(give func(), closedErr error) *SlotWatch {
	if !hasHoldLimits(s.permit) || s.conn == nil {
		return nil
	}
	return &SlotWatch{w: newHoldWatch(s.permit, s.conn, give, liveRef{}, closedErr)}
}

// Enter starts one of the adapter's calls on the connection, or returns
// why there is none to make: the hold ended. Each Enter that returns nil
// needs a Leave.
func (w *SlotWatch) Enter() error {
	if w == nil {
		return nil
	}
	return w.w.enter()
}

// Leave ends a call that Enter started; the hold ends now if its MaxHold
// passed during it.
func (w *SlotWatch) Leave() {
	if w != nil {
		w.w.leave()
	}
}

// Claim is the adapter's own end of the hold: nil when the adapter is to
// give the connection and the slot back, else the error of a hold that
// the watch ended (and gave back) or an earlier Claim.
func (w *SlotWatch) Claim() error {
	if w == nil {
		return nil
	}
	return w.w.claim()
}

// Disarm stops the watch for good, when the adapter hands out the
// connection itself, whose use the watch cannot see. It reports false when
// the hold had ended.
func (w *SlotWatch) Disarm() bool {
	if w == nil {
		return true
	}
	return w.w.disarm()
}
