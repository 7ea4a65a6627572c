package tenantdbtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

// base is what every server started in a container keeps: what it is, for
// errors, and its container, nil for an existing server or a start that
// failed before creating one. Postgres, Redis, Jaeger, Prometheus, the Redis
// Cluster and Sentinel embed it and share its start, run and terminate
// plumbing.
type base struct {
	what string
	ctr  testcontainers.Container
	term terminator
}

// newBase is the base of c, which may be a nil pointer of a module's
// container type: ctr is then nil, not an interface holding a nil pointer.
func newBase[C testcontainers.Container](what string, c C) base {
	var zero C
	if any(c) == any(zero) {
		return base{what: what}
	}
	return base{what: what, ctr: c}
}

func (b *base) started() *base { return b }

// startable is a server type of this package: a pointer that embeds base.
type startable interface {
	comparable
	started() *base
}

// startForTest runs run under t's context for a StartX helper: the
// container, once created, is terminated when t ends, even when the start
// failed after creating it; an error fails t.
func startForTest[S startable](t testing.TB, run func(context.Context) (S, error)) S {
	t.Helper()
	s, err := run(t.Context())
	var zero S
	if s != zero && s.started().ctr != nil {
		testcontainers.CleanupContainer(t, s.started().ctr)
	}
	if err != nil {
		t.Fatalf("%v", err)
	}
	return s
}

// runForProgram runs run for a RunX helper, whose caller terminates the
// server: on error it terminates whatever container the start left, and
// returns nil.
func runForProgram[S startable](ctx context.Context, run func(context.Context) (S, error)) (S, error) {
	s, err := run(ctx)
	var zero S
	if err != nil {
		if s != zero {
			// ctx may be what ended the start: terminate without it.
			_ = s.started().terminate(context.Background())
		}
		return zero, err
	}
	return s, nil
}

// terminate is every Terminate: it stops and removes s's container; it does
// nothing for a nil s or an existing server, and only its first call does
// anything.
func terminate[S startable](ctx context.Context, s S) error {
	var zero S
	if s == zero {
		return nil
	}
	return s.started().terminate(ctx)
}

func (b *base) terminate(ctx context.Context) error {
	if b.ctr == nil {
		return nil
	}
	return b.term.do(ctx, b.ctr, b.what)
}

// service is how StartX and RunX get a server that may also be an existing
// one: the server envVar names when it is set, else one started in a
// container.
type service[S startable, O any] struct {
	envVar   string
	existing func(value string) (S, error)         // the server envVar names
	run      func(context.Context, []O) (S, error) // starts a container
	describe func(S) string                        // for the log of a start
	timeout  time.Duration                         // of start, if not 0
}

// start is StartX: the existing server, as it is, or one started for t
// (startForTest) and logged. It fails t when neither can be had.
func (sv service[S, O]) start(t testing.TB, opts []O) S {
	t.Helper()
	if v := sv.existingValue(); v != "" {
		if len(opts) > 0 {
			t.Logf("tenantdbtest: %s is set: using that server as it is, options are not applied", sv.envVar)
		}
		s, err := sv.existing(v)
		if err != nil {
			t.Fatalf("%v", err)
		}
		return s
	}
	s := startForTest(t, func(ctx context.Context) (S, error) {
		if sv.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, sv.timeout)
			defer cancel()
		}
		return sv.run(ctx, opts)
	})
	t.Logf("tenantdbtest: %s", sv.describe(s))
	return s
}

// runForProgram is RunX: the existing server, or one started under ctx
// (runForProgram).
func (sv service[S, O]) runForProgram(ctx context.Context, opts []O) (S, error) {
	if v := sv.existingValue(); v != "" {
		return sv.existing(v)
	}
	return runForProgram(ctx, func(ctx context.Context) (S, error) { return sv.run(ctx, opts) })
}

// existingValue is the value of envVar, which names an existing server; ""
// for a service that has none.
func (sv service[S, O]) existingValue() string {
	if sv.envVar == "" {
		return ""
	}
	return os.Getenv(sv.envVar)
}

// withOptions returns cfg as opts change it, in order.
func withOptions[C any, O ~func(*C)](cfg C, opts []O) C {
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}
