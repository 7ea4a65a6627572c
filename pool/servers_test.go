package pool_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
)

// directory is a Placement backed by a map, counting its calls.
type directory struct {
	mu    sync.Mutex
	at    map[string]pool.Placement
	calls atomic.Int64
}

func (d *directory) place(_ context.Context, id string) (pool.Placement, error) {
	d.calls.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.at[id]
	if !ok {
		return pool.Placement{}, fmt.Errorf("tenant %q is in no directory entry", id)
	}
	return p, nil
}

func (d *directory) set(id string, p pool.Placement) {
	d.mu.Lock()
	d.at[id] = p
	d.mu.Unlock()
}

func serversConfig(d *directory) pool.Config {
	return pool.Config{
		Servers:   map[string]int{"a": 2, "b": 3},
		Placement: d.place,
		Plans:     map[string]pool.Plan{"p": {MaxConns: 2, MaxWaiting: 10}},
	}
}

// A tenant whose server is full waits, and a tenant on another server is
// granted at once: no server's tenants wait for another's capacity.
func TestServersHaveTheirOwnCapacity(t *testing.T) {
	d := &directory{at: map[string]pool.Placement{
		"a1": {Server: "a"}, "a2": {Server: "a"}, "b1": {Server: "b", Database: "db_b1"}, "b2": {Server: "b"},
	}}
	g := mustNew(t, serversConfig(d))
	if got := g.Capacity(); got != 5 {
		t.Fatalf("Capacity() = %d, want the servers' sum 5", got)
	}
	held := []pool.Permit{mustAcquire(t, g, "a1"), mustAcquire(t, g, "a1")} // server a is full
	ch := acquireAsync(context.Background(), g, "a2")
	eventually(t, "a2 waits for server a", tenantWaitingIs(g, "a2", 1))

	b1 := mustAcquire(t, g, "b1") // server b has room: no wait behind a
	if got := b1.Placement(); got != (pool.Placement{Server: "b", Database: "db_b1"}) {
		t.Errorf("b1's permit is placed at %+v", got)
	}
	b2 := []pool.Permit{mustAcquire(t, g, "b2"), mustAcquire(t, g, "b2")}
	assertPending(t, ch, g, "a2", 1)

	var ss []pool.ServerStat
	ss = g.AppendServerStat(ss)
	want := []pool.ServerStat{{Server: "a", Capacity: 2, InUse: 2}, {Server: "b", Capacity: 3, InUse: 3}}
	if fmt.Sprint(ss) != fmt.Sprint(want) {
		t.Errorf("AppendServerStat = %+v, want %+v", ss, want)
	}
	if s, _ := g.TenantStat("b1"); s.Server != "b" {
		t.Errorf("TenantStat(b1).Server = %q", s.Server)
	}

	b1.Release() // frees server b, not a: a2 keeps waiting
	assertPending(t, ch, g, "a2", 1)
	held[0].Release()
	r := recv(t, ch)
	if r.err != nil || r.p.Placement().Server != "a" {
		t.Fatalf("a2: %v, placed at %+v", r.err, r.p.Placement())
	}
	r.p.Release()
	held[1].Release()
	for _, p := range b2 {
		p.Release()
	}
	assertDrained(t, g)
}

// A tenant without a usable placement fails with ErrNoPlacement, and the
// failure is cached as a Lookup failure is: never a default server.
func TestPlacementFailsClosed(t *testing.T) {
	d := &directory{at: map[string]pool.Placement{"lost": {Server: "z"}}}
	cfg := serversConfig(d)
	cfg.LookupErrorTTL = time.Hour
	g := mustNew(t, cfg)
	for _, id := range []string{"unknown", "lost"} {
		for range 3 {
			_, err := g.Acquire(context.Background(), id)
			if !errors.Is(err, pool.ErrNoPlacement) {
				t.Fatalf("%s: got %v, want ErrNoPlacement", id, err)
			}
		}
	}
	if n := d.calls.Load(); n != 2 {
		t.Errorf("Placement was called %d times for 6 requests of 2 tenants, want 2 (failures cached)", n)
	}
	panicky := serversConfig(d)
	panicky.Placement = func(context.Context, string) (pool.Placement, error) { panic("directory down") }
	g = mustNew(t, panicky)
	if _, err := g.Acquire(context.Background(), "x"); !errors.Is(err, pool.ErrNoPlacement) {
		t.Fatalf("a panicking Placement: got %v, want ErrNoPlacement", err)
	}
	assertDrained(t, g)
}

// A new placement takes effect once the tenant holds no capacity: a permit
// granted meanwhile is still on the server its tenant's permits in use are.
func TestPlacementChangesWhenTheTenantHoldsNothing(t *testing.T) {
	d := &directory{at: map[string]pool.Placement{"m": {Server: "a"}}}
	cfg := serversConfig(d)
	cfg.LookupTTL = time.Nanosecond // every request asks again
	g := mustNew(t, cfg)
	first := mustAcquire(t, g, "m")
	d.set("m", pool.Placement{Server: "b"})
	second := mustAcquire(t, g, "m")
	if got := second.Placement().Server; got != "a" {
		t.Errorf("a permit granted while the tenant holds one on a went to %q", got)
	}
	if s := g.AppendServerStat(nil); s[0].InUse != 2 || s[1].InUse != 0 {
		t.Errorf("server stats %+v, want both permits on a", s)
	}
	first.Release()
	second.Release()
	if s, _ := g.TenantStat("m"); s.Server != "b" {
		t.Errorf("after its last release the tenant is on %q, want b", s.Server)
	}
	third := mustAcquire(t, g, "m")
	if got := third.Placement().Server; got != "b" {
		t.Errorf("the next permit went to %q, want b", got)
	}
	third.Release()
	assertDrained(t, g)
}

// A reservation is kept on the tenant's own server, and moves with it.
func TestReservationsArePerServer(t *testing.T) {
	d := &directory{at: map[string]pool.Placement{"r": {Server: "a"}, "o": {Server: "a"}, "ob": {Server: "b"}}}
	cfg := serversConfig(d)
	cfg.Plans = map[string]pool.Plan{"p": {MaxConns: 2}, "res": {MaxConns: 1, ReservedConns: 1}}
	cfg.DefaultPlan = "p"
	cfg.Lookup = func(_ context.Context, id string) (pool.Tenant, error) {
		if id == "r" {
			return pool.Tenant{Plan: "res"}, nil
		}
		return pool.Tenant{}, nil
	}
	g := mustNew(t, cfg)
	mustAcquire(t, g, "r").Release() // r's reservation is in force on a
	o := mustAcquire(t, g, "o")
	ch := acquireAsync(context.Background(), g, "o") // the last unit of a is r's
	eventually(t, "o waits", tenantWaitingIs(g, "o", 1))
	ob := []pool.Permit{mustAcquire(t, g, "ob"), mustAcquire(t, g, "ob")} // b keeps nothing for r
	if s := g.AppendServerStat(nil); s[0].Reserved != 1 || s[1].Reserved != 0 || s[0].InUse != 1 {
		t.Errorf("server stats %+v, want r's reservation on a only, and one unit of a in use", s)
	}
	assertPending(t, ch, g, "o", 1)
	for _, p := range ob {
		p.Release()
	}
	assertPending(t, ch, g, "o", 1)
	o.Release()
	r := recv(t, ch)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.p.Release()
	assertDrained(t, g)
}

func TestServersConfigErrors(t *testing.T) {
	place := func(context.Context, string) (pool.Placement, error) { return pool.Placement{Server: "a"}, nil }
	for name, cfg := range map[string]pool.Config{
		"servers without placement": {Servers: map[string]int{"a": 2}},
		"placement without servers": {Capacity: 2, Placement: place},
		"empty server name":         {Servers: map[string]int{"": 2}, Placement: place},
		"zero capacity":             {Servers: map[string]int{"a": 0}, Placement: place},
		"capacity not the sum":      {Servers: map[string]int{"a": 2, "b": 2}, Capacity: 3, Placement: place},
		"plan above the smallest":   {Servers: map[string]int{"a": 2, "b": 8}, Placement: place, Plans: map[string]pool.Plan{"p": {MaxConns: 3}}},
	} {
		if _, err := pool.New(cfg); !errors.Is(err, pool.ErrInvalidConfig) {
			t.Errorf("%s: got %v, want ErrInvalidConfig", name, err)
		}
	}
}

// A drained tenant's new requests wait (or are rejected, by their queue
// policy) while its permits in use finish; Resume places it anew and serves
// them there. Other tenants on its server are not held.
func TestDrainMovesATenant(t *testing.T) {
	d := &directory{at: map[string]pool.Placement{"m": {Server: "a"}, "o": {Server: "a"}}}
	g := mustNew(t, serversConfig(d))
	inFlight := mustAcquire(t, g, "m")
	dr, err := g.Drain(context.Background(), "m")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Drain(context.Background(), "m"); !errors.Is(err, pool.ErrMoving) {
		t.Errorf("a second Drain: %v, want ErrMoving", err)
	}
	ch := acquireAsync(context.Background(), g, "m")
	eventually(t, "m's new request waits", tenantWaitingIs(g, "m", 1))
	mustAcquire(t, g, "o").Release() // the server's capacity is there, for others
	select {
	case <-dr.Done():
		t.Fatal("Done before the permit in flight was released")
	default:
	}
	if err := dr.Resume(&pool.Placement{Server: "b"}); err == nil {
		t.Error("Resume with a placement while a permit is in use succeeded")
	}
	// That Resume ended the drain where the tenant was: m's request is served on a.
	r := recv(t, ch)
	if r.err != nil || r.p.Placement().Server != "a" {
		t.Fatalf("after an early Resume: %v on %+v, want served on a", r.err, r.p.Placement())
	}
	r.p.Release()

	dr, err = g.Drain(context.Background(), "m")
	if err != nil {
		t.Fatal(err)
	}
	ch = acquireAsync(context.Background(), g, "m")
	eventually(t, "m's new request waits", tenantWaitingIs(g, "m", 1))
	inFlight.Release()
	<-dr.Done()
	assertPending(t, ch, g, "m", 1)
	d.set("m", pool.Placement{Server: "b"}) // the directory says so too, for the next refresh
	if err := dr.Resume(&pool.Placement{Server: "b"}); err != nil {
		t.Fatal(err)
	}
	r = recv(t, ch)
	if r.err != nil || r.p.Placement().Server != "b" {
		t.Fatalf("after the move: %v on %+v, want served on b", r.err, r.p.Placement())
	}
	r.p.Release()
	assertDrained(t, g)
}

// A drained tenant whose plan rejects over its cap is rejected, as over it.
func TestDrainKeepsTheQueuePolicy(t *testing.T) {
	d := &directory{at: map[string]pool.Placement{"m": {Server: "a"}}}
	cfg := serversConfig(d)
	cfg.Plans = map[string]pool.Plan{"p": {MaxConns: 2}} // MaxWaiting 0
	g := mustNew(t, cfg)
	dr, err := g.Drain(context.Background(), "m")
	if err != nil {
		t.Fatal(err)
	}
	<-dr.Done() // it held nothing
	if _, err := g.Acquire(context.Background(), "m"); !errors.Is(err, pool.ErrOverLimit) {
		t.Fatalf("during the drain: %v, want ErrOverLimit", err)
	}
	if err := dr.Resume(nil); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, g, "m").Release()
	assertDrained(t, g)
}
