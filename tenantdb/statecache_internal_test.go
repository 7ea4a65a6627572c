package tenantdb

import (
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// pgConnWithPID returns an idle PgConn with backend PID pid over a pipe.
func pgConnWithPID(t *testing.T, pid uint32) *pgconn.PgConn {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	cfg, err := pgconn.ParseConfig("postgres://tenantdb@127.0.0.1/tenantdb")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pgconn.Construct(&pgconn.HijackedConn{Conn: a, PID: pid, TxStatus: txIdle, Config: cfg, CustomData: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	return pc
}

// Two connections on one slot of stateCache each keep their own state, and
// forgetting one never empties the slot of the other.
func TestStateCacheTellsConnectionsOnOneSlotApart(t *testing.T) {
	pid := uint32(4242)
	first := pgConnWithPID(t, pid)
	second := pgConnWithPID(t, pid+uint32(len(stateCache))) // the same slot
	slot := &stateCache[pid%uint32(len(stateCache))]

	a := stateOf(first)
	b := stateOf(second) // takes the slot
	if a == b {
		t.Fatal("two connections on one slot share a connState")
	}
	a.tenant, b.tenant = "a", "b"
	if got := stateOf(first); got != a || got.tenant != "a" {
		t.Fatalf("stateOf(first) after second took the slot = %p (tenant %q), want %p", got, got.tenant, a)
	}
	if got := stateOf(second); got != b {
		t.Fatalf("stateOf(second) = %p, want %p", got, b)
	}
	if first.CustomData()[stateKey] != a || second.CustomData()[stateKey] != b {
		t.Fatal("a connState is missing from its connection's CustomData")
	}

	forgetState(first) // not in the slot: leaves it
	if slot.Load() != b {
		t.Fatal("forgetState of a connection not in the slot emptied it")
	}
	forgetState(second)
	if slot.Load() != nil {
		t.Fatal("forgetState left the connection in its slot")
	}
	if got := stateOf(second); got != b {
		t.Fatalf("stateOf(second) after forgetState = %p, want its state %p from CustomData", got, b)
	}
}
