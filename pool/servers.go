package pool

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Servers. The shared stage of admission (stage 3 in admit.go) is split by
// server when Config.Servers is set: each server has its own capacity,
// reservations, class shares and fair rings, and a tenant's requests take
// capacity on its own server only (Config.Placement says which). A server
// is a parameter of the shared stage, as a class is of every stage: one
// admission loop still. Without Config.Servers there is one server, named
// "", of Config.Capacity.

// Placement is where a tenant's work runs when Config.Servers is set: one of
// the servers, and a database on it (tenantdb's; "" for its default).
type Placement struct {
	Server   string
	Database string
}

// ErrNoPlacement is matched by the error of a request whose tenant has no
// usable placement: Config.Placement failed, panicked, or named a server
// that is not one of Config.Servers. Such a request never runs on another
// server.
var ErrNoPlacement = errors.New("pool: no placement for the tenant")

// shared is one server's part of the shared stage.
type shared struct {
	name        string
	index       int
	capacity    int
	maxReserved int

	used          int           // guarded by Gate.mu: permits granted to its tenants
	reservedFree  int           // guarded by Gate.mu: Σ max(0, reserved-inUse) over its tenants
	reservedTotal int           // guarded by Gate.mu: Σ reserved over its tenants
	classes       []*stageClass // by class index; fixed after New
	classTurn     int           // guarded by Gate.mu: the named class whose turn is next in nextLaneLocked
	affine        int           // guarded by Gate.mu: permits granted by affinity since the last in the fair order
}

// stageClass is one class's part of one server's shared stage.
type stageClass struct {
	share int // most permits the class may hold on the server: MaxShare of its capacity, at least 1
	keep  int // MinShare of its capacity, at least 1; 0 for the default class

	used     int        // guarded by Gate.mu: permits of the class held on the server
	ring     fairRing   // guarded by Gate.mu: lanes of the class waiting for the server's capacity
	reserved list[lane] // guarded by Gate.mu: lanes of the class waiting while their tenant is below its reservation
}

// placed is a tenant's placement in force, with its server's stage. It is
// never changed once made, so a permit may keep a pointer to it.
type placed struct {
	Placement
	srv *shared
}

// newShared returns the stage of a server of the given capacity.
func newShared(name string, index, capacity, maxReserved int, classes []*classState) *shared {
	s := &shared{name: name, index: index, capacity: capacity, maxReserved: maxReserved}
	for _, c := range classes {
		sc := &stageClass{share: capacity}
		if c.index != 0 {
			sc.share = max(1, int(math.Floor(c.MaxShare*float64(capacity)+1e-9)))
			sc.keep = min(sc.share, max(1, int(math.Floor(c.MinShare*float64(capacity)+1e-9))))
		}
		s.classes = append(s.classes, sc)
	}
	return s
}

// newServers returns the stages of cfg's servers, by name, or the one
// stage of Capacity without Config.Servers.
func newServers(cfg *Config, classes []*classState) map[string]*placed {
	if len(cfg.Servers) == 0 {
		return map[string]*placed{"": {srv: newShared("", 0, cfg.Capacity, cfg.MaxReserved, classes)}}
	}
	m := make(map[string]*placed, len(cfg.Servers))
	for i, name := range slices.Sorted(mapKeys(cfg.Servers)) {
		m[name] = &placed{Placement: Placement{Server: name}, srv: newShared(name, i, cfg.Servers[name], cfg.MaxReserved, classes)}
	}
	return m
}

// validateServers checks Config.Servers and Config.Placement, and sets
// Capacity to the servers' sum.
func (c *Config) validateServers() error {
	if len(c.Servers) == 0 {
		if c.Placement != nil {
			return fmt.Errorf("%w: Placement needs Servers", ErrInvalidConfig)
		}
		return nil
	}
	if c.Placement == nil {
		return fmt.Errorf("%w: Servers needs Placement, which says where each tenant runs", ErrInvalidConfig)
	}
	total := 0
	for name, n := range c.Servers {
		if name == "" || strings.IndexByte(name, 0) >= 0 {
			return fmt.Errorf("%w: a server name is empty or holds a NUL byte", ErrInvalidConfig)
		}
		if n <= 0 {
			return fmt.Errorf("%w: server %q: capacity must be positive, got %d", ErrInvalidConfig, name, n)
		}
		total += n
	}
	if c.Capacity != 0 && c.Capacity != total {
		return fmt.Errorf("%w: with Servers, Capacity is their sum %d; leave it 0, got %d", ErrInvalidConfig, total, c.Capacity)
	}
	c.Capacity = total
	return nil
}

// tenantCapacity is the capacity every tenant's limits must fit in: the
// smallest server's with Servers, else Capacity.
func (c *Config) tenantCapacity() int {
	if len(c.Servers) == 0 {
		return c.Capacity
	}
	n := math.MaxInt
	for _, v := range c.Servers {
		n = min(n, v)
	}
	return n
}

// place asks Config.Placement where tenant id runs, unlocked. A panic is
// an error, as a failure is.
func (g *Gate) place(ctx context.Context, id string) (p Placement, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: Config.Placement panicked for tenant %q: %v", ErrNoPlacement, id, r)
		}
	}()
	if p, err = g.cfg.Placement(ctx, id); err != nil {
		return p, fmt.Errorf("%w: Config.Placement for tenant %q: %w", ErrNoPlacement, id, err)
	}
	return p, nil
}

// placedLocked returns the placement in force for p, or an error naming
// the servers when p's server is not one of them.
func (g *Gate) placedLocked(id string, p Placement) (*placed, error) {
	s := g.servers[p.Server]
	if s == nil {
		return nil, fmt.Errorf("%w: Config.Placement put tenant %q on server %q, which is not one of Config.Servers (%s)",
			ErrNoPlacement, id, p.Server, strings.Join(slices.Sorted(mapKeys(g.servers)), ", "))
	}
	if p.Database == "" {
		return s, nil
	}
	return &placed{Placement: p, srv: s.srv}, nil
}

// placeLocked puts t where at says, at once if t holds no capacity (no
// permit in use, none waiting for capacity or a cluster slot), else when it
// next does (settleLocked): its permits in use and granted meanwhile keep
// the placement they were granted on.
func (g *Gate) placeLocked(t *tenant, at *placed) {
	if t.place == nil {
		t.place, t.srv = at, at.srv
		return
	}
	if t.place.Placement == at.Placement {
		t.next = nil
		return
	}
	t.next = at
	g.settleLocked(t)
}

// settleLocked moves t to its next placement if it has one and holds no
// capacity, taking its reservation along.
func (g *Gate) settleLocked(t *tenant) {
	if t.next == nil || t.held() > 0 {
		return
	}
	at := t.next
	t.next = nil
	old := t.srv
	g.unreserveLocked(t)
	t.place, t.srv = at, at.srv
	g.reserveLocked(t)
	if old != t.srv {
		g.dispatchLocked(old) // what t kept reserved there is free now
	}
	g.promoteLocked(t)
	g.dispatchLocked(t.srv)
}

// unreserveLocked takes t's reservation out of its server's.
func (g *Gate) unreserveLocked(t *tenant) {
	s := t.srv
	s.reservedFree -= max(0, t.reserved-t.inUse)
	s.reservedTotal -= t.reserved
	t.reserved = 0
}

// Placement returns where the permit's work runs: its tenant's placement
// when it was granted (Config.Placement); the zero Placement without
// Config.Servers. Only the permit's holder may call it, before Release.
func (p Permit) Placement() Placement {
	if p.s == nil || p.s.place == nil {
		return Placement{}
	}
	return p.s.place.Placement
}

// ServerStat is one server's part of the shared stage.
type ServerStat struct {
	Server string
	// Capacity is the server's (Config.Servers); InUse the permits its
	// tenants hold; Reserved the reservations in force on it.
	Capacity, InUse, Reserved int
}

// AppendServerStat appends one ServerStat per server (by name) to dst;
// without Config.Servers, one for the whole capacity, named "".
func (g *Gate) AppendServerStat(dst []ServerStat) []ServerStat {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.serverList {
		dst = append(dst, ServerStat{Server: s.name, Capacity: s.capacity, InUse: s.used, Reserved: s.reservedTotal})
	}
	return dst
}
