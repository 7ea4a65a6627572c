// Command noisy runs the noisy-neighbour experiment on a real PostgreSQL:
// with a shared pool of 20 connections and a per-tenant cap of 10, a noisy
// tenant sends 200 queries of 1 s at once while a quiet tenant sends 50
// queries of 20 ms spread over a second.
// It runs them behind a raw shared pgxpool, behind tenantdb (queueing,
// rejecting, and oversubscribed plans where the fair gate decides) and behind
// PgBouncer, and writes a table and a chart of what each tenant saw.
//
// By default it runs the guide's experiment (shared, queue, reject) and the
// fair row, in about a minute, and exits 1 when a target of that table is
// missed; -scenarios all runs every scenario.
//
//	go run ./bench/noisy                 # starts PostgreSQL in Docker
//	go run ./bench/noisy -scale 0.25     # four times faster
//	go run ./bench/noisy -scenarios all -json -out bench/results
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

func main() {
	var opts options
	flag.StringVar(&opts.dsn, "dsn", "", "PostgreSQL to use (default: start one in Docker with tenantdbtest)")
	flag.Float64Var(&opts.scale, "scale", 1, "time scale: 1 = queries of 1 s (noisy) and 20 ms (quiet); 0.25 is four times faster")
	flag.BoolVar(&opts.json, "json", false, "print one JSON object per scenario and tenant on stdout instead of the table")
	flag.StringVar(&opts.out, "out", "", "directory for the report (noisy.md, quiet_p50.png, results.json); empty writes none")
	flag.StringVar(&opts.only, "scenarios", "", "comma-separated scenarios to run, or all (default "+strings.Join(defaultScenarios, ",")+": the guide's experiment and weighted fair share with a reservation): "+strings.Join(scenarioNames(), ","))
	flag.StringVar(&opts.cpuset, "cpuset", "1", "host CPUs for the CPU-bound scenarios' PostgreSQL (docker --cpuset-cpus); one CPU, so the client keeps the others")
	flag.StringVar(&opts.otlp, "otlp", "", "send the run's traces to this OTLP/gRPC endpoint, e.g. Jaeger's localhost:4317")
	flag.StringVar(&opts.metrics, "metrics", "", "serve the run's metrics for Prometheus at http://ADDR/metrics, e.g. localhost:9464")
	flag.IntVar(&opts.rounds, "rounds", 2, "rounds of every limit in the oracle-* scenarios")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("noisy: ")
	if opts.rounds < 1 || opts.rounds > 20 {
		log.Fatalf("-rounds %d: want 1 to 20", opts.rounds)
	}
	if opts.scale <= 0 || opts.scale > 10 {
		log.Fatalf("-scale %v: want a number in (0, 10]", opts.scale)
	}
	if opts.only != "" && opts.only != "all" {
		for _, name := range strings.Split(opts.only, ",") {
			if !slices.Contains(scenarioNames(), strings.TrimSpace(name)) {
				log.Fatalf("-scenarios: no scenario %q; want all or some of %s", name, strings.Join(scenarioNames(), ","))
			}
		}
	}

	disableReaperUnlessAsked()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts); err != nil {
		log.Fatal(err)
	}
}

type options struct {
	dsn, out, only, otlp string
	metrics, cpuset      string
	scale                float64
	rounds               int
	json                 bool
}

func run(ctx context.Context, opts options) error {
	pg := &tenantdbtest.Postgres{DSN: opts.dsn}
	if opts.dsn == "" && opts.needsPostgres() {
		progress("starting PostgreSQL in Docker (tenantdbtest; -dsn uses an existing server)")
		var err error
		startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		pg, err = tenantdbtest.RunPostgres(startCtx)
		cancel()
		if err != nil {
			return reaperHint(err)
		}
		defer pg.Terminate(context.Background())
	}
	env, err := newEnvironment(ctx, pg, opts)
	if err != nil {
		return err
	}
	defer env.close()

	var results []result
	n, i := opts.count(), 0
	for _, sc := range scenarios {
		if !opts.selected(sc.name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		i++
		progress("[%d/%d] %s: %s", i, n, sc.name, sc.about)
		rs, err := sc.run(ctx, env, sc.name)
		if err != nil {
			if skip, ok := err.(skipError); ok {
				progress("%s: skipped: %s", sc.name, skip.why)
				continue
			}
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		results = append(results, rs...)
	}

	if opts.json {
		enc := json.NewEncoder(os.Stdout)
		for _, r := range results {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
	} else {
		fmt.Print(markdownTable(results, opts.scale))
		fmt.Print(targets(results, opts.scale))
		fmt.Print(oracleTable(results))
	}
	if opts.out != "" {
		if err := writeReport(opts.out, results, opts.scale); err != nil {
			return err
		}
		progress("report written to %s", opts.out)
	}
	if missed := guideMissed(results, opts.scale); len(missed) > 0 {
		return fmt.Errorf("the guide's table does not hold here: %s", strings.Join(missed, "; "))
	}
	return nil
}

// disableReaperUnlessAsked turns off testcontainers' reaper (Ryuk) unless
// TESTCONTAINERS_RYUK_DISABLED is set: its image comes from a registry, and
// where none is reachable every container start fails. The command removes
// its containers itself on every path but a kill (they are labelled
// org.testcontainers=true); set the variable to false to have the reaper.
func disableReaperUnlessAsked() {
	if _, set := os.LookupEnv("TESTCONTAINERS_RYUK_DISABLED"); set {
		return
	}
	if err := os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true"); err != nil {
		log.Fatal(err)
	}
}

// reaperHint says what to do when the reaper was asked for and could not
// start, which is where no registry is reachable.
func reaperHint(err error) error {
	if strings.Contains(err.Error(), "reaper") {
		return fmt.Errorf("%w (the reaper needs its image from a registry: run with TESTCONTAINERS_RYUK_DISABLED=true)", err)
	}
	return err
}

// needsPostgres reports whether a selected scenario queries PostgreSQL:
// the http-* scenarios do not.
func (o options) needsPostgres() bool {
	for _, sc := range scenarios {
		if o.selected(sc.name) && !strings.HasPrefix(sc.name, "http-") {
			return true
		}
	}
	return false
}

// defaultScenarios are what runs without -scenarios: the guide's experiment
// (shared, queue, reject) and the row no semaphore gives, weighted fair
// share with a reservation (fair). About a minute at scale 1.
var defaultScenarios = []string{"shared", "queue", "reject", "fair"}

func (o options) selected(name string) bool {
	switch strings.TrimSpace(o.only) {
	case "":
		return slices.Contains(defaultScenarios, name)
	case "all":
		return true
	}
	for _, s := range strings.Split(o.only, ",") {
		if strings.TrimSpace(s) == name {
			return true
		}
	}
	return false
}

// count is the number of selected scenarios.
func (o options) count() int {
	n := 0
	for _, sc := range scenarios {
		if o.selected(sc.name) {
			n++
		}
	}
	return n
}

// progress prints a status line on stderr, so stdout stays the report.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "noisy: "+format+"\n", args...)
}

// skipError is a scenario that cannot run here, with the reason.
type skipError struct{ why string }

func (s skipError) Error() string { return "skipped: " + s.why }
