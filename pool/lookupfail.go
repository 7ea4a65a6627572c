package pool

import "strings"

// failedLookups remembers the tenants whose Lookup failed lately, so that a
// flood of requests for an unknown tenant (or during an outage of the store
// behind Lookup) asks Lookup once per Config.LookupErrorTTL instead of once
// per request. All entries live equally long, so they expire in the order
// they were added: a queue finds the expired ones with O(1) work per
// request. At most Config.MaxTenants are kept; at the bound the oldest goes.
type failedLookups struct {
	byID  map[string]failedLookup // guarded by Gate.mu
	order []failedAt              // guarded by Gate.mu: in the order added, from head
	head  int                     // guarded by Gate.mu
}

type failedLookup struct {
	err error
	at  int64 // clock when Lookup failed
}

type failedAt struct {
	id string
	at int64
}

// getLocked returns the cached failure of id, if it is younger than ttl.
func (f *failedLookups) getLocked(id string, now, ttl int64) error {
	e, ok := f.byID[id]
	if !ok || now-e.at > ttl {
		return nil
	}
	return e.err
}

// addLocked caches err as id's failure at now, after dropping the expired
// entries (and the oldest, at the bound).
func (f *failedLookups) addLocked(id string, err error, now, ttl int64, bound int) {
	for f.head < len(f.order) && (now-f.order[f.head].at > ttl || len(f.byID) >= bound) {
		f.dropOldestLocked()
	}
	if f.byID == nil {
		f.byID = make(map[string]failedLookup)
	}
	id = strings.Clone(id) // do not pin the caller's buffer
	f.byID[id] = failedLookup{err: err, at: now}
	f.order = append(f.order, failedAt{id: id, at: now})
}

// dropOldestLocked removes the oldest queued entry, and its failure unless a
// newer one replaced it; the queue is compacted once half of it is spent.
func (f *failedLookups) dropOldestLocked() {
	old := f.order[f.head]
	f.order[f.head] = failedAt{}
	f.head++
	if e, ok := f.byID[old.id]; ok && e.at == old.at {
		delete(f.byID, old.id)
	}
	if f.head > len(f.order)/2 {
		f.order = append(f.order[:0], f.order[f.head:]...)
		f.head = 0
	}
}

// forgetLocked drops id's failure (InvalidateTenant); its queue entry goes
// when it expires.
func (f *failedLookups) forgetLocked(id string) { delete(f.byID, id) }
