package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// fakeRun is a run of configuration c with no server, for the checks that
// need none.
func fakeRun(c config) *runCtx {
	e := &env{templateDB: "app", defaultPath: "$user,public", tenants: []string{"t0", "t1"}}
	return &runCtx{cfg: c, env: e, stickyState: map[string]map[string]bool{}}
}

// TestCheckProbe: the probe's judge passes the tenant's own values and its
// own leftovers, and flags another tenant's leftover in any field, the wrong
// database, and untagged state the tenant never set.
func TestCheckProbe(t *testing.T) {
	c, _ := findConfig("session-all")
	rc := fakeRun(c)
	good := c.expected(rc.env, "t0")
	good.nonce = 7
	if bad := rc.checkProbe("t0", 7, good); len(bad) != 0 {
		t.Fatalf("the tenant's own values: %v", bad)
	}
	own := good
	own.searchPath = "evil_t0, public"
	own.marker = "public"
	if bad := rc.checkProbe("t0", 7, own); len(bad) != 0 {
		t.Fatalf("the tenant's own leftover: %v", bad)
	}
	cases := map[string]func(r *probeResult){
		"leftover":  func(r *probeResult) { r.listens = "evil_t1" },
		"database":  func(r *probeResult) { r.database = "iso_t1" },
		"role":      func(r *probeResult) { r.user = "isoapp" },
		"marker":    func(r *probeResult) { r.marker = "public" },
		"read-only": func(r *probeResult) { r.stickyVisible = "ro" },
		"nonce":     func(r *probeResult) { r.nonce = 8 },
		"rls":       func(r *probeResult) { r.rls = "t0,t1" },
		"rls-other": func(r *probeResult) { r.rls = "t1" },
		"tx-ro":     func(r *probeResult) { r.stickyVisible = "rt" },
	}
	for name, mutate := range cases {
		r := good
		mutate(&r)
		if bad := rc.checkProbe("t0", 7, r); len(bad) == 0 {
			t.Errorf("%s: not flagged", name)
		}
	}
	if r := good; true {
		r.rls = "t0"
		if bad := rc.checkProbe("t0", 7, r); len(bad) != 0 {
			t.Errorf("the tenant's own row under row-level security: %v", bad)
		}
	}
	rc.markSticky("t0", "ro")
	r := good
	r.stickyVisible = "ro"
	if bad := rc.checkProbe("t0", 7, r); len(bad) != 0 {
		t.Errorf("read-only the tenant set itself: %v", bad)
	}
}

// TestJudgeErr: the error judge passes documented errors and the context's,
// and flags a raw network timeout and another statement's SQLSTATE.
func TestJudgeErr(t *testing.T) {
	rc := fakeRun(configs[0])
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	live := context.Background()
	start := time.Now()
	ok := []struct {
		ctx context.Context
		err error
	}{
		{live, nil},
		{live, fmt.Errorf("wrapped: %w", tenantdb.ErrOverLimit)},
		{ended, fmt.Errorf("timeout: %w", context.Canceled)},
		{ended, &pgconn.PgError{Code: "57014", Message: "canceling statement due to user request"}},
	}
	for _, c := range ok {
		if m := rc.judgeErr(c.ctx, "t0", c.err, false, nil, start); m != "" {
			t.Errorf("%v: %s", c.err, m)
		}
	}
	bad := []struct {
		ctx context.Context
		err error
	}{
		{ended, errors.New("read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout")},
		{live, &pgconn.PgError{Code: "26000", Message: "prepared statement does not exist"}},
		{live, &pgconn.PgError{Code: "08P01", Message: "bind message supplies 2 parameters"}},
	}
	for _, c := range bad {
		if m := rc.judgeErr(c.ctx, "t0", c.err, false, nil, start); !strings.Contains(m, "unexpected") {
			t.Errorf("%v: not flagged", c.err)
		}
	}
}

// TestReplicaJudges: where a probe ran and ErrReplicaUnavailable are judged
// by the call's read-only mark and the fallback (replicas.go).
func TestReplicaJudges(t *testing.T) {
	live, start := context.Background(), time.Now()
	marked := tenantdb.ReadOnly(live)
	txMarked := context.WithValue(live, txReadOnlyKey{}, true)
	unavailable := fmt.Errorf("wrapped: %w", tenantdb.ErrReplicaUnavailable)
	for _, c := range []struct {
		config  string
		ctx     context.Context
		standby string
		err     error
		bad     bool
	}{
		{"replicas", live, "true", nil, true},       // an unmarked call on the replica
		{"replicas", marked, "false", nil, false},   // ReadPrimary fell back
		{"replicas", marked, "true", nil, false},    //
		{"replicas-tx", marked, "false", nil, true}, // FailRead on the primary
		{"replicas-tx", txMarked, "false", nil, true},
		{"replicas-tx", txMarked, "true", nil, false},
		{"session", live, "true", nil, true},
		{"replicas-tx", marked, "", unavailable, false},
		{"replicas-tx", txMarked, "", unavailable, false},
		{"replicas-tx", live, "", unavailable, true},
		{"replicas", marked, "", unavailable, true},                     // ReadPrimary never fails so
		{"replicas-tx", marked, "", errors.New("unexpected EOF"), true}, // no cut-off
	} {
		cfg, _ := findConfig(c.config)
		rc := fakeRun(cfg)
		var got bool
		if c.err != nil {
			got = rc.judgeErr(c.ctx, "t0", c.err, false, nil, start) != ""
		} else {
			got = len(rc.checkWhere(c.ctx, probeResult{standby: c.standby})) != 0
		}
		if got != c.bad {
			t.Errorf("%s, read-only %v, standby %q, %v: flagged %v, want %v", c.config, readOnly(c.ctx), c.standby, c.err, got, c.bad)
		}
	}
}

// TestHoldLimitErrors: a hold's end by a time limit is accepted where the
// plan has limits, and nowhere else.
func TestHoldLimitErrors(t *testing.T) {
	ended := fmt.Errorf("%w (50ms; held 61ms): %w", tenantdb.ErrIdleInTransaction, tenantdb.ErrConnReleased)
	for name, want := range map[string]bool{"timelimits": false, "timelimits-tx": false, "session": true} {
		cfg, _ := findConfig(name)
		if got := fakeRun(cfg).judgeErr(context.Background(), "t0", ended, false, nil, time.Now()) != ""; got != want {
			t.Errorf("%s: flagged %v, want %v", name, got, want)
		}
	}
}

// TestServersRoleDefaultsJudge: in the servers configuration a refusal for
// changed login role defaults is accepted only while one of the tenant's
// servers had hostile defaults, never on another server nor after the undo.
func TestServersRoleDefaultsJudge(t *testing.T) {
	cfg, _ := findConfig("servers")
	sr := &srvRun{rc: fakeRun(cfg), pos: map[string][]string{"t0": {"s0"}, "t1": {"s1"}, "t2": {"s2", "s1"}},
		mv: map[string][]*window{}, flt: map[string]time.Time{}}
	sr.roles.init(nil)
	refused := fmt.Errorf("wrapped: %w", tenantdb.ErrRoleDefaultsChanged)
	before := time.Now()
	sr.roles.begin([]string{"s1"})
	sr.roles.end([]string{"s1"})
	for _, c := range []struct {
		tenant string
		i0     int
		bad    bool
	}{
		{"t1", 0, false}, // on the server with hostile defaults
		{"t0", 0, true},  // on another server
		{"t2", 0, false}, // moved to it during the call
		{"t2", 1, false},
	} {
		if got := sr.judge(context.Background(), c.tenant, refused, c.i0, before) != ""; got != c.bad {
			t.Errorf("%s since placement %d, s1 dirty: flagged %v, want %v", c.tenant, c.i0, got, c.bad)
		}
	}
	sr.roles.open["s1"].w.to = time.Now() // undone
	delete(sr.roles.open, "s1")
	if sr.judge(context.Background(), "t1", refused, 0, time.Now().Add(time.Millisecond)) == "" {
		t.Error("a refusal in a call that began after the undo was accepted")
	}
}
