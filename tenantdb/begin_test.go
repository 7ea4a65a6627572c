package tenantdb_test

import (
	"testing"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestWithLocalSettings: the settings go first, or right after a leading
// BEGIN or START TRANSACTION whatever its spelling, comments and modes.
func TestWithLocalSettings(t *testing.T) {
	const local = "select set_config('app.tenant_id', 'a', true)"
	for sql, want := range map[string]string{
		"select 1":                               local + ";\nselect 1",
		"insert into t values (1); select 1":     local + ";\ninsert into t values (1); select 1",
		"beginning()":                            local + ";\nbeginning()",
		"BEGIN":                                  "BEGIN;\n" + local,
		"begin;":                                 "begin;\n" + local,
		"  begin isolation level serializable; ": "  begin isolation level serializable;\n" + local,
		"START TRANSACTION READ ONLY; insert into t values (1)":           "START TRANSACTION READ ONLY;\n" + local + ";\n insert into t values (1)",
		"/* a /* nested */ comment */ begin -- ; not the end\n; select 1": "/* a /* nested */ comment */ begin -- ; not the end\n;\n" + local + ";\n select 1",
		"-- a line\nbegin": "-- a line\nbegin;\n" + local,
	} {
		if got := tenantdb.WithLocalSettings(sql, local); got != want {
			t.Errorf("WithLocalSettings(%q)\n got %q\nwant %q", sql, got, want)
		}
	}
}
