package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// resetParts are the statements of tenantdb's reset at release
// (resetStatements in tenantdb/release.go), in its order: a test there
// keeps them equal.
var resetParts = []string{
	"reset all",
	"close all",
	"set session authorization default",
	"discard plans",
	"discard temp",
	"discard sequences",
	"select name, from_sql, statement from pg_catalog.pg_prepared_statement()",
	"select pg_catalog.pg_advisory_unlock_all(), pg_catalog.pg_listening_channels()",
	"unlisten *",
}

// mergedReports is the two reports of the reset as one statement: a
// channel's row has a null from_sql.
const mergedReports = "select name, from_sql, statement from pg_catalog.pg_prepared_statement() " +
	"union all select pg_catalog.pg_listening_channels(), null, null from pg_catalog.pg_advisory_unlock_all()"

// joinedListing lists the prepared statements and releases the advisory
// locks in one statement: a session with no statements gives a row of
// nulls.
const joinedListing = "select p.name, p.from_sql, p.statement from pg_catalog.pg_advisory_unlock_all() " +
	"left join pg_catalog.pg_prepared_statement() p on true"

// fromListening is the listing of channels the reset had before: from
// the unlock in a FROM clause.
const fromListening = "select pg_catalog.pg_listening_channels() from pg_catalog.pg_advisory_unlock_all()"

// without returns resetParts less the statements dropped, joined as one
// simple-protocol query.
func without(dropped ...string) string {
	var kept []string
	for _, s := range resetParts {
		if !slices.Contains(dropped, s) {
			kept = append(kept, s)
		}
	}
	return strings.Join(kept, "; ")
}

// BenchmarkResetStatementInstructions counts the server instructions of
// each statement of the reset at release alone, of the whole reset, and of
// the variants issue 50 asked to measure, on a session in the state
// BenchmarkHandoverServerInstructions leaves (one statement pgx prepared,
// nothing else). A cycle is the statement in a simple query of its own,
// then pgx's `select $1::int`, so that what a statement costs the next
// execute (DISCARD PLANS: a re-plan) counts too; the table gives each
// cycle less a cycle of pgx's query alone. Skipped without a server under
// callgrind (bench/callgrind-postgres.sh).
func BenchmarkResetStatementInstructions(b *testing.B) {
	dsn, out := callgrindServer(b)
	const cycles, warm = 300, 30
	ctx := context.Background()
	// instructions runs n cycles of sql (none for "") after the warm ones,
	// on a connection of its own, and returns its server process's total.
	instructions := func(sql string, n int) int64 {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			b.Fatal(err)
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		var pid int
		if err := conn.QueryRow(ctx, "select pg_catalog.pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
			b.Fatal(err)
		}
		for i := range warm + n {
			if sql != "" {
				if _, err := conn.PgConn().Exec(ctx, sql).ReadAll(); err != nil {
					b.Fatalf("%s: %v", sql, err)
				}
			}
			var v int
			if err := conn.QueryRow(ctx, "select $1::int", i).Scan(&v); err != nil {
				b.Fatal(err)
			}
		}
		if err := conn.Close(ctx); err != nil {
			b.Fatal(err)
		}
		return callgrindTotal(b, filepath.Join(out, fmt.Sprintf("out.%d", pid)))
	}
	perCycle := func(sql string) float64 {
		return float64(instructions(sql, cycles)-instructions(sql, 0)) / cycles
	}
	type row struct{ name, sql string }
	rows := []row{{"`select 1` (a round trip's floor)", "select 1"}, {"`reset role` (dropped)", "reset role"}}
	for _, s := range resetParts {
		rows = append(rows, row{"`" + s + "`", s})
	}
	rows = append(rows,
		row{"the whole reset", without()},
		row{"the whole reset with `reset role` (before)", strings.Replace(without(), "default; ", "default; reset role; ", 1)},
		row{"the whole reset before (`reset role`, the channels from the unlock's FROM)",
			strings.Replace(strings.Replace(without(), "default; ", "default; reset role; ", 1), resetParts[7], fromListening, 1)},
		row{"the whole reset less `discard plans`", without("discard plans")},
		row{"the whole reset less both reports", without(resetParts[6], resetParts[7])},
		row{"the two reports, in one query", resetParts[6] + "; " + resetParts[7]},
		row{"the two reports as one UNION ALL", mergedReports},
		row{"a count of statements prepared from SQL", "select count(*) filter (where from_sql), count(*) from pg_catalog.pg_prepared_statement()"},
		row{"the statements as one record each", "select pg_catalog.pg_prepared_statement()"},
		row{"the statements, joined to the unlock", joinedListing},
		row{"the statements joined to the unlock; the channels", joinedListing + "; select pg_catalog.pg_listening_channels()"},
		row{"the whole reset, the reports so", without(resetParts[6], resetParts[7], "unlisten *") + "; " + joinedListing + "; select pg_catalog.pg_listening_channels(); unlisten *"},
		row{"the channels from the unlock's FROM (before)", fromListening},
		row{"the whole reset, the channels from the unlock's FROM", strings.Replace(without(), resetParts[7], fromListening, 1)},
		row{"the whole reset, the statements as records", strings.Replace(without(), resetParts[6], "select pg_catalog.pg_prepared_statement()", 1)},
		row{"`select pg_catalog.pg_advisory_unlock_all()`", "select pg_catalog.pg_advisory_unlock_all()"},
		row{"`select pg_catalog.pg_listening_channels()`", "select pg_catalog.pg_listening_channels()"},
	)
	instructions("", 0) // the server's first connections cost more: not measured
	for b.Loop() {
		base := perCycle("")
		var table strings.Builder
		fmt.Fprintf(&table, "\n| statement(s), then pgx's query | server instructions per cycle, less pgx's query alone (%.0f) |\n|---|---:|\n", base)
		for _, r := range rows {
			fmt.Fprintf(&table, "| %s | %.0f |\n", r.name, perCycle(r.sql)-base)
		}
		fmt.Println(table.String())
	}
	b.ReportMetric(0, "ns/op")
}
