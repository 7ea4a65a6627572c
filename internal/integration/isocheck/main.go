// Command isocheck is tenantdb's isolation checker: several tenants run a
// seeded random workload, hostile SQL included, over few connections in every
// configuration a user can choose, and after every operation the server is
// asked where the statement ran, as whom, with which values and what it saw.
// It starts PostgreSQL (and PgBouncer, Redis) itself:
//
//	go run ./internal/integration/isocheck -duration 30m -seed 1
//
// A violation prints the seed, the configuration and a shortened sequence of
// operations that still fails; the last line counts operations, faults,
// hostile statements and violations, and the exit status is 1 on any violation.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"time"
)

// options are the command's flags.
type options struct {
	duration time.Duration // in total, split between the configurations
	seed     uint64
	config   string // one configuration's name, or "all"
	faults   bool
	shrink   time.Duration // the most time spent shortening each failure
	noModes  bool          // put no pgx options among the probe's arguments
	maxConns int           // MaxConns (the budget); 0: 2 to 4, drawn per configuration
}

// totals are what the last line reports.
type totals struct {
	ops, faults, hostiles, violations int64
	configs                           int
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", time.Minute, "how long to run, split between the configurations")
	flag.Uint64Var(&o.seed, "seed", 0, "the seed (0: a fresh one, printed)")
	flag.StringVar(&o.config, "config", "all", "one configuration, or all")
	flag.BoolVar(&o.faults, "faults", true, "end random backends of the pool from an admin connection")
	flag.DurationVar(&o.shrink, "shrink", 3*time.Minute, "the most time spent shortening each failure")
	flag.BoolVar(&o.noModes, "no-options", false, "put no pgx per-query options among the arguments (to look past issue 51's 8)")
	flag.IntVar(&o.maxConns, "maxconns", 0, "MaxConns, the budget with a database per tenant (0: 2 to 4, drawn)")
	list := flag.Bool("list", false, "list the configurations and the hostile statements, and exit")
	flag.Parse()
	if *list {
		for _, c := range configs {
			fmt.Println("config", c.name)
		}
		for _, h := range catalog {
			fmt.Println("hostile", h.name)
		}
		return
	}
	if _, set := os.LookupEnv("TESTCONTAINERS_RYUK_DISABLED"); !set {
		// Ryuk's image needs a registry; the checker removes its containers itself.
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	t, err := check(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "isocheck:", err)
		os.Exit(2)
	}
	if t.violations > 0 {
		os.Exit(1)
	}
}

// check starts the servers, runs the checker with o and writes its report
// to out; its last line is the totals.
func check(ctx context.Context, o options, out io.Writer) (t totals, err error) {
	chosen, err := choose(o.config)
	if err != nil {
		return t, err
	}
	needPooler, needRedis := false, false
	for _, c := range chosen {
		needPooler = needPooler || c.pooler
		needRedis = needRedis || c.cluster
	}
	e, err := startEnv(ctx, needPooler, needRedis, func(f string, a ...any) { fmt.Fprintf(out, "isocheck: "+f+"\n", a...) })
	if err != nil {
		return t, err
	}
	defer e.close()
	return checkOn(ctx, e, o, out)
}

// kindsOf counts vs by kind (violationKind), each with its first
// occurrence: the list of violations shows only the first ten.
func kindsOf(vs []violation) []string {
	type kind struct {
		n     int
		first violation
	}
	var order []string
	byKind := map[string]*kind{}
	for _, v := range vs {
		k := violationKind(v.msg)
		if len(k) > 160 {
			k = k[:160]
		}
		if byKind[k] == nil {
			byKind[k] = &kind{first: v}
			order = append(order, k)
		}
		byKind[k].n++
	}
	var out []string
	for _, k := range order {
		x := byKind[k]
		out = append(out, fmt.Sprintf("%d× %q, first at %v after op %d", x.n, k, x.first.at.Round(time.Millisecond), x.first.seq))
	}
	return out
}

// choose returns the configuration named name, or all of them for "all".
func choose(name string) ([]config, error) {
	var chosen []config
	for _, c := range configs {
		if name == "all" || name == c.name {
			chosen = append(chosen, c)
		}
	}
	if len(chosen) == 0 {
		return nil, fmt.Errorf("no configuration %q (see -list)", name)
	}
	return chosen, nil
}

// checkOn runs the checker with o on the servers of e.
func checkOn(ctx context.Context, e *env, o options, out io.Writer) (t totals, err error) {
	if o.seed == 0 {
		o.seed = rand.Uint64()
	}
	chosen, err := choose(o.config)
	if err != nil {
		return t, err
	}
	fmt.Fprintf(out, "isocheck: seed %d, %d configurations, %v\n", o.seed, len(chosen), o.duration)
	defer func() {
		fmt.Fprintf(out, "isocheck: seed %d: %d operations, %d faults, %d hostile statements in %d configurations: %d violations\n",
			o.seed, t.ops, t.faults, t.hostiles, t.configs, t.violations)
	}()
	each := o.duration / time.Duration(len(chosen))
	for i, c := range chosen {
		if ctx.Err() != nil {
			break
		}
		if c.pooler && !e.havePooler || c.cluster && e.redisAddr == "" {
			fmt.Fprintf(out, "isocheck: %s: skipped, its server could not be had\n", c.name)
			continue
		}
		seed := o.seed + uint64(i)*1_000_003
		r := rand.New(rand.NewPCG(seed, 7))
		ro := runOptions{seed: seed, maxConns: 2 + r.IntN(3), workers: numTenants + 2, duration: each, faults: o.faults, noModes: o.noModes}
		if o.maxConns > 0 {
			ro.maxConns = o.maxConns
		}
		start := time.Now()
		run := runOnce
		if c.servers {
			run = runServers
		}
		rc, err := run(ctx, e, c, ro)
		if err != nil {
			return t, fmt.Errorf("%s: %w", c.name, err)
		}
		t.configs++
		t.ops += rc.ops.Load()
		t.faults += rc.faults.Load()
		t.hostiles += rc.hostiles.Load()
		vs := rc.sortedViolations()
		t.violations += int64(len(vs))
		fmt.Fprintf(out, "isocheck: %s (seed %d, MaxConns %d): %d operations, %d faults, %d hostile statements, %d violations in %v\n",
			c.name, seed, ro.maxConns, rc.ops.Load(), rc.faults.Load(), rc.hostiles.Load(), len(vs), time.Since(start).Round(time.Millisecond))
		if d, r := rc.dbDrops.Load(), rc.redisOut.Load(); d+r > 0 {
			fmt.Fprintf(out, "  of the faults: %d databases dropped and created again, %d Redis cut-offs\n", d, r)
		}
		if c.servers {
			fmt.Fprintf(out, "  %d tenants on %d servers: %d moves, %d failed\n", srvTenants, numServers, rc.srvMoves, rc.srvMoveFails)
		}
		if c.replicas {
			st := rc.replicaStat
			fmt.Fprintf(out, "  the replica: %d reads routed to it, %d cut-offs, %d replay pauses\n", st.Reads, rc.replicaOut.Load(), rc.replicaPauses.Load())
		}
		if c.holdLimits {
			fmt.Fprintf(out, "  %d holds ended by a time limit (IdleInTransactionTimeout %v, MaxHold %v)\n", rc.holdEnds.Load(), idleTimeout, maxHold)
		}
		if a := rc.adapters; a != nil {
			fmt.Fprintf(out, "  through the adapters: %d HTTP requests, %d jobs accepted and run\n", a.nextCall.Load(), a.ran.Load())
		}
		if top := rc.topAccepted(3); top != "" {
			fmt.Fprintf(out, "  accepted errors%s\n", top)
		}
		if rc.poolerDied.Load() || rc.poolerRestarts > 0 {
			log := rc.poolerLog
			if i := strings.LastIndex(log, "FATAL"); i >= 0 {
				log = log[i:]
			}
			log = strings.TrimSpace(log[:min(len(log), 200)])
			if rc.poolerRestarts > 0 {
				fmt.Fprintf(out, "  PgBouncer died %d times and was started again, each counted as a fault (last: %s)\n", rc.poolerRestarts, log)
			}
			if rc.poolerDied.Load() {
				fmt.Fprintf(out, "  the run stopped early: PgBouncer died and could not be started again\n")
			}
		}
		if len(vs) == 0 {
			continue
		}
		for _, k := range kindsOf(vs) {
			fmt.Fprintf(out, "  kind: %s\n", k)
		}
		for j, v := range vs {
			if j == 10 {
				fmt.Fprintf(out, "  ... and %d more\n", len(vs)-10)
				break
			}
			if v.op != "" {
				fmt.Fprintf(out, "  VIOLATION at %v after op %d (%s): %s\n", v.at.Round(time.Millisecond), v.seq, v.op, v.msg)
			} else {
				fmt.Fprintf(out, "  VIOLATION at %v: %s\n", v.at.Round(time.Millisecond), v.msg)
			}
		}
		if o.shrink > 0 && c.servers {
			fmt.Fprintf(out, "  not shortened (the servers configuration has no replay): go run ./internal/integration/isocheck -config %s -seed %d -maxconns %d\n",
				c.name, seed, ro.maxConns)
		} else if o.shrink > 0 {
			short, ok := shrink(ctx, e, c, ro, rc, o.shrink, out)
			if ok {
				fmt.Fprintf(out, "  shortened to %d ops that still fail with %q (config %s, seed %d, MaxConns %d):\n",
					len(short), violationKind(vs[0].msg), c.name, seed, ro.maxConns)
			} else {
				fmt.Fprintf(out, "  did not reproduce in a replay (timing); the %d ops run before it (config %s, seed %d, MaxConns %d):\n", len(short), c.name, seed, ro.maxConns)
			}
			for j, x := range short {
				if j == 40 {
					fmt.Fprintf(out, "    ... %d more\n", len(short)-40)
					break
				}
				fmt.Fprintf(out, "    %s\n", x)
			}
		}
	}
	return t, nil
}
