package tenantdb_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// acquireEvent is one call of a user's pgx AcquireTracer.
type acquireEvent struct {
	start   bool
	fromRun bool // End's context carries what Start returned
	conn    bool // End's Conn is set
	err     error
}

// userAcquireTracer is a user's pgx tracer that also traces acquires, as
// otelpgx's does.
type userAcquireTracer struct {
	mu      sync.Mutex
	events  []acquireEvent
	onStart func()
}

type startKey struct{}

func (u *userAcquireTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (u *userAcquireTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (u *userAcquireTracer) TraceAcquireStart(ctx context.Context, p *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	u.mu.Lock()
	u.events = append(u.events, acquireEvent{start: true})
	on := u.onStart
	u.mu.Unlock()
	if on != nil {
		on()
	}
	return context.WithValue(ctx, startKey{}, "started")
}

func (u *userAcquireTracer) TraceAcquireEnd(ctx context.Context, p *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.events = append(u.events, acquireEvent{fromRun: ctx.Value(startKey{}) == "started", conn: d.Conn != nil, err: d.Err})
}

// take returns the events so far and forgets them.
func (u *userAcquireTracer) take() []acquireEvent {
	u.mu.Lock()
	defer u.mu.Unlock()
	e := u.events
	u.events = nil
	return e
}

// expectOneAcquire checks that events are one Start and one End whose
// context is Start's, with a connection and no error when ok is nil, else
// with no connection and an error matching wantErr.
func expectOneAcquire(t *testing.T, what string, events []acquireEvent, wantErr error) {
	t.Helper()
	if len(events) != 2 || !events[0].start || events[1].start {
		t.Fatalf("%s: tracer saw %+v, want one Start then one End", what, events)
	}
	end := events[1]
	if !end.fromRun {
		t.Errorf("%s: End did not get the context its Start returned", what)
	}
	if wantErr == nil {
		if end.err != nil || !end.conn {
			t.Errorf("%s: End got conn=%v err=%v, want a connection and no error", what, end.conn, end.err)
		}
		return
	}
	if end.conn || !errors.Is(end.err, wantErr) {
		t.Errorf("%s: End got conn=%v err=%v, want no connection and %v", what, end.conn, end.err, wantErr)
	}
}

// A pgx AcquireTracer on the pgxpool.Config sees every tenant acquire as
// pgxpool's would: once, from before the tenant gate's wait to the
// connection, and the gate's refusals (no tenant, over the cap, a cancelled
// context) as failed acquires.
func TestUserAcquireTracerSeesTheGate(t *testing.T) {
	tr := &userAcquireTracer{}
	pcfg := pgxConfig(t, sharedPG, 4)
	pcfg.ConnConfig.Tracer = tr
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"one": {MaxConns: 1, MaxWaiting: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx := as("acme")

	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	expectOneAcquire(t, "Acquire", tr.take(), nil)

	// acme's one slot is held: a second acquire waits in the gate, and the
	// tracer's span is open for the whole wait.
	waited := make(chan error, 1)
	go func() {
		c2, err := p.Acquire(ctx)
		if err == nil {
			c2.Release()
		}
		waited <- err
	}()
	eventually(t, "the second acquire waits in the gate", func() bool { return p.TenantStat("acme").Waiting == 1 })
	if e := tr.take(); len(e) != 1 || !e[0].start {
		t.Fatalf("while the acquire waits in the gate the tracer saw %+v, want its Start alone", e)
	}
	// A third is over the cap and the queue of one: rejected.
	var over *tenantdb.OverLimitError
	if _, err := p.Acquire(ctx); !errors.As(err, &over) {
		t.Fatalf("third acquire: %v, want an OverLimitError", err)
	}
	expectOneAcquire(t, "over-limit Acquire", tr.take(), tenantdb.ErrOverLimit)
	c.Release()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	// The waiter's End came once, with its connection; its Release then.
	events := tr.take()
	if len(events) != 1 || events[0].start || !events[0].fromRun || !events[0].conn || events[0].err != nil {
		t.Fatalf("after the wait the tracer saw %+v, want one End with a connection", events)
	}

	if _, err := p.Acquire(context.Background()); !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("acquire without a tenant: %v", err)
	}
	expectOneAcquire(t, "Acquire without a tenant", tr.take(), tenantdb.ErrNoTenant)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.Acquire(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire with a cancelled context: %v", err)
	}
	expectOneAcquire(t, "Acquire with a cancelled context", tr.take(), context.Canceled)

	// The calls that acquire for themselves are traced once each too.
	if _, err := p.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	expectOneAcquire(t, "Exec", tr.take(), nil)
	if err := p.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	expectOneAcquire(t, "Ping", tr.take(), nil)
	if err := p.Ping(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("ping with a cancelled context: %v", err)
	}
	expectOneAcquire(t, "Ping with a cancelled context", tr.take(), context.Canceled)
	// A health check's Ping (no tenant) is pgxpool's own acquire, traced by it.
	if err := p.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	expectOneAcquire(t, "health-check Ping", tr.take(), nil)
	assertNothingHeld(t, p)
}

// Pool.Config returns the config the Pool was created from, as pgxpool's
// does: a second pool created from it runs the user's hooks once and
// tenantdb's once, not stacked.
func TestConfigIsTheUsers(t *testing.T) {
	pcfg := pgxConfig(t, sharedPG, 2)
	tr := &userAcquireTracer{}
	pcfg.ConnConfig.Tracer = tr
	var mu sync.Mutex
	connects := 0
	pcfg.AfterConnect = func(context.Context, *pgx.Conn) error {
		mu.Lock()
		connects++
		mu.Unlock()
		return nil
	}
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)

	got := p.Config()
	if got.PrepareConn != nil || got.AfterRelease != nil || got.BeforeClose != nil || got.ConnConfig.AfterNetConnect != nil {
		t.Errorf("Config carries hooks the user did not set: PrepareConn=%v AfterRelease=%v BeforeClose=%v AfterNetConnect=%v",
			got.PrepareConn != nil, got.AfterRelease != nil, got.BeforeClose != nil, got.ConnConfig.AfterNetConnect != nil)
	}
	if got.ConnConfig.Tracer != pgx.QueryTracer(tr) {
		t.Errorf("Config's tracer is %T, want the user's", got.ConnConfig.Tracer)
	}
	if got.ConnString() != pcfg.ConnString() || got.MaxConns != pcfg.MaxConns {
		t.Errorf("Config is %q MaxConns %d, want %q MaxConns %d", got.ConnString(), got.MaxConns, pcfg.ConnString(), pcfg.MaxConns)
	}
	if got == p.Config() || got.ConnConfig == p.Config().ConnConfig {
		t.Error("Config returns the same config twice, want a copy each time")
	}
	// The user's AfterConnect is the one in Config: calling it counts once.
	if err := got.AfterConnect(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if connects != 1 {
		t.Errorf("Config's AfterConnect ran the user's hook %d times, want 1", connects)
	}
	connects = 0
	mu.Unlock()

	// A second pool from p.Config(): one connection runs the user's hook once
	// and its acquire is traced once.
	p2, err := tenantdb.New(context.Background(), p.Config(), tenantdb.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p2.Close)
	tr.take()
	if _, err := p2.Exec(as("acme"), "select 1"); err != nil {
		t.Fatal(err)
	}
	expectOneAcquire(t, "second pool's Exec", tr.take(), nil)
	mu.Lock()
	if connects != 1 {
		t.Errorf("the second pool's first connection ran the user's AfterConnect %d times, want 1", connects)
	}
	mu.Unlock()
	if c := p2.Config(); c.PrepareConn != nil || c.ConnConfig.AfterNetConnect != nil {
		t.Error("the second pool's Config carries tenantdb's hooks")
	}
}
