package pool

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Workload classes. A class is a second axis of the same Gate: inside each
// tenant's cap, work of a class (WithClass) may hold at most the class's
// MaxConns of the tenant's slots and queues by the class's own MaxWaiting
// and MaxWait; at the shared capacity, all tenants' work of the class holds
// at most its MaxShare. Work without a class is the default class: the plan's
// queue policy, the tenant's cap less what the other classes hold, no share
// bound, and served first when the capacity is contended, except that a
// class holding less than its MinShare goes first so that it never starves,
// at the shared capacity and inside each tenant's cap alike.
// A class is a parameter of the existing stages, not a stage of its own.

// DefaultClass names the class of work that carries none. WithClass with it
// is the same as no class; Config.Classes may not use it.
const DefaultClass = "default"

// MaxClasses is the most classes Config.Classes may hold, besides the
// default class: it bounds per-class state and the cardinality of per-class
// metrics.
const MaxClasses = 8

const (
	defaultMaxShare = 0.75
	defaultMinShare = 0.1
	maxClassNameLen = 32
)

// Class is a class of work inside every tenant, such as "batch" for imports
// and background jobs beside the tenant's interactive requests. The zero
// value of every field but MaxConns means its documented default.
type Class struct {
	// MaxConns is how many of one tenant's slots its work of this class may
	// hold at once, within the tenant's cap, so the tenant's work of the
	// default class always has at least its cap less the other classes'
	// MaxConns. Required: from 1 to the MaxConns of every plan that does
	// not set its own (Plan.ClassConns). A tenant whose cap is lowered
	// below it (a Lookup answer, SetTenantLimit) holds at most its cap.
	MaxConns int

	// MaxWaiting and MaxWait are the class's queue policy, in place of the
	// plan's, for its requests over MaxConns or over the tenant's cap: as
	// Plan.MaxWaiting and Plan.MaxWait. Default 0: rejected at once.
	MaxWaiting int
	MaxWait    time.Duration

	// MaxShare is the fraction of Config.Capacity (of each server's, with
	// Config.Servers) that the class's work of all tenants together may
	// hold at once, so that work of the default
	// class finds free capacity without waiting behind any tenant's batch.
	// Default 0.75; from 0 to 1; at least one permit.
	MaxShare float64

	// MinShare is the fraction of Config.Capacity kept for the class when
	// the capacity is contended: while the class holds less, its waiting
	// requests are served before the default class's, so that busy
	// default-class work never starves it. Inside each tenant the same
	// fraction of the tenant's cap (at least one slot, at most the class's
	// cap) is kept for the class: while its work waits and it holds less,
	// the tenant's freed slots go to it before the tenant's default class.
	// It keeps nothing idle: it only orders who gets a released permit.
	// Default 0.1; at least one permit; at most MaxShare.
	MinShare float64

	// StatementTimeout, when positive, bounds each statement of the class's
	// work on the server, below its tenant's (Plan.StatementTimeout): the
	// smaller of the two applies. Default 0: the tenant's.
	StatementTimeout time.Duration

	// IdleInTransactionTimeout and MaxHold, when positive, bound the
	// class's transactions and held connections below its tenant's
	// (Plan.IdleInTransactionTimeout, Plan.MaxHold): the smaller applies.
	// Default 0: the tenant's.
	IdleInTransactionTimeout, MaxHold time.Duration

	// Budget, when its Rate is positive, gives each tenant's work of the
	// class a share of connection-time of its own, as Plan.Budget gives
	// the tenant's: a request of the class needs both budgets to allow
	// it, and out of it is rejected or waits by the class's MaxWaiting and
	// MaxWait. Default: none, only the tenant's.
	Budget Budget
}

// classState is a class in force in a Gate. Gate.classes[0] is the default
// class; the rest are Config.Classes in name order. Classes never change
// after New.
type classState struct {
	name  string
	Class // the default class's MaxConns is unused: the tenant's limit is its cap
	index uint8
	burst int64 // Budget's burst with its default, ns
	// Its share of each server's capacity, what it holds there and its
	// fair ring are the server's (shared.classes).

	used     int // guarded by Gate.mu: permits of the class held, all tenants
	waiting  int // guarded by Gate.mu: requests of the class waiting, all tenants
	counters     // guarded by Gate.mu
}

type classKey struct{}

// classesUsed is set by the first WithClass: until then no context carries
// a class, and ClassFrom need not walk a context's chain to find none.
var classesUsed atomic.Bool

// WithClass returns a copy of ctx whose requests are admitted as work of
// class name (one of Config.Classes, or DefaultClass). It does not validate
// the name: the Gate that admits a request does (ErrUnknownClass). tenantdb,
// tenantsql, poolhttp and Runner jobs all read it.
func WithClass(ctx context.Context, name string) context.Context {
	if !classesUsed.Load() {
		classesUsed.Store(true) // before the context exists
	}
	return context.WithValue(ctx, classKey{}, name)
}

// ClassFrom returns the class ctx carries, and false when it carries none.
func ClassFrom(ctx context.Context) (string, bool) {
	if !classesUsed.Load() {
		return "", false
	}
	name, ok := ctx.Value(classKey{}).(string)
	return name, ok
}

// classOf returns the class of ctx's requests, or an error wrapping
// ErrUnknownClass.
func (g *Gate) classOf(ctx context.Context) (*classState, error) {
	name, ok := ClassFrom(ctx)
	if !ok || name == DefaultClass {
		return g.classes[0], nil
	}
	if len(g.classes) > 1 { // a linear scan: at most MaxClasses, and no map hash on the path
		for _, c := range g.classes[1:] {
			if c.name == name {
				return c, nil
			}
		}
	}
	if err := validateClassName(name); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnknownClass, err)
	}
	names := make([]string, len(g.classes))
	for i, c := range g.classes {
		names[i] = c.name
	}
	return nil, fmt.Errorf("%w %q: the classes are %s", ErrUnknownClass, name, strings.Join(names, ", "))
}

// validateClassName reports why name cannot name a class: it must be 1 to
// 32 bytes of ASCII letters, digits, '_', '-' and '.', as a metric label
// wants it.
func validateClassName(name string) error {
	if name == "" {
		return fmt.Errorf("empty class name (leave the class out for %q)", DefaultClass)
	}
	if len(name) > maxClassNameLen {
		return fmt.Errorf("class name of %d bytes, longer than %d", len(name), maxClassNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("class name %q: byte %d is not a letter, digit, '_', '-' or '.'", name, i)
		}
	}
	return nil
}

// newClasses returns the classes in force for cfg, validated with defaults
// applied: the default class first, then cfg.Classes by name.
func newClasses(cfg *Config) ([]*classState, error) {
	if len(cfg.Classes) > MaxClasses {
		return nil, fmt.Errorf("%w: %d Classes, at most %d", ErrInvalidConfig, len(cfg.Classes), MaxClasses)
	}
	classes := []*classState{{name: DefaultClass, Class: Class{MaxShare: 1}}}
	capacity := cfg.tenantCapacity()
	for _, name := range slices.Sorted(mapKeys(cfg.Classes)) {
		c := cfg.Classes[name]
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: class %q: %s", ErrInvalidConfig, name, fmt.Sprintf(format, args...))
		}
		if err := validateClassName(name); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if name == DefaultClass {
			return nil, bad("the name is taken by the class of work without one")
		}
		if c.MaxShare == 0 {
			c.MaxShare = defaultMaxShare
		}
		if c.MinShare == 0 {
			c.MinShare = min(defaultMinShare, c.MaxShare)
		}
		switch {
		case c.MaxConns <= 0:
			return nil, bad("MaxConns must be positive, got %d", c.MaxConns)
		case c.MaxConns > capacity:
			return nil, bad("MaxConns %d is above the capacity %d", c.MaxConns, capacity)
		case c.MaxWaiting < Unbounded:
			return nil, bad("MaxWaiting must be 0 or more, or Unbounded, got %d", c.MaxWaiting)
		case c.MaxWait < 0:
			return nil, bad("MaxWait must not be negative, got %v", c.MaxWait)
		case c.StatementTimeout < 0:
			return nil, bad("StatementTimeout must not be negative, got %v", c.StatementTimeout)
		case c.IdleInTransactionTimeout < 0:
			return nil, bad("IdleInTransactionTimeout must not be negative, got %v", c.IdleInTransactionTimeout)
		case c.MaxHold < 0:
			return nil, bad("MaxHold must not be negative, got %v", c.MaxHold)
		case c.Budget.validate() != nil:
			return nil, bad("%v", c.Budget.validate())
		case !(c.MaxShare > 0 && c.MaxShare <= 1):
			return nil, bad("MaxShare must be above 0 and at most 1, got %v", c.MaxShare)
		case !(c.MinShare > 0 && c.MinShare <= c.MaxShare):
			return nil, bad("MinShare must be above 0 and at most MaxShare %v, got %v", c.MaxShare, c.MinShare)
		}
		classes = append(classes, &classState{name: name, Class: c, index: uint8(len(classes)), burst: c.Budget.burst()})
	}
	return classes, nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// validateClassConns checks plan p's class caps against the classes: every
// class p names exists, and every class's cap for p's tenants (p's own or
// the class's MaxConns) is from 1 to p.MaxConns.
func validateClassConns(name string, p Plan, classes []*classState) error {
	for cn, n := range p.ClassConns {
		if !slices.ContainsFunc(classes[1:], func(c *classState) bool { return c.name == cn }) {
			return fmt.Errorf("%w: plan %q: ClassConns names %q, which is not one of Classes", ErrInvalidConfig, name, cn)
		}
		if n <= 0 || n > p.MaxConns {
			return fmt.Errorf("%w: plan %q: ClassConns[%q] %d must be from 1 to the plan's MaxConns %d",
				ErrInvalidConfig, name, cn, n, p.MaxConns)
		}
	}
	for _, c := range classes[1:] {
		if _, own := p.ClassConns[c.name]; !own && c.MaxConns > p.MaxConns {
			return fmt.Errorf("%w: class %q: MaxConns %d is above plan %q's MaxConns %d (set the plan's ClassConns[%q] for its tenants)",
				ErrInvalidConfig, c.name, c.MaxConns, name, p.MaxConns, c.name)
		}
	}
	return nil
}

// classCaps returns a plan's cap per class index (0, the default class,
// unused).
func classCaps(p Plan, classes []*classState) []int {
	if len(classes) == 1 {
		return nil
	}
	caps := make([]int, len(classes))
	for i, c := range classes[1:] {
		caps[i+1] = c.MaxConns
		if n, ok := p.ClassConns[c.name]; ok {
			caps[i+1] = n
		}
	}
	return caps
}
