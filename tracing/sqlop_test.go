package tracing

import "testing"

func TestOperationName(t *testing.T) {
	for sql, want := range map[string]string{
		"select 1":                                   "SELECT",
		"  \n\tINSERT INTO t VALUES (1)":             "INSERT",
		"(select 1) union (select 2)":                "SELECT",
		"-- a comment\nupdate t set a = 1":           "UPDATE",
		"/* a /* nested */ comment */ delete from t": "DELETE",
		"with x as (select 1) select * from x":       "WITH",
		"begin":                                      "BEGIN",
		";;  commit":                                 "COMMIT",
		"":                                           "",
		"   ":                                        "",
		"-- only a comment":                          "",
		"/* unterminated":                            "",
		"$1":                                         "",
		"1 + 1":                                      "",
		"averyveryverylongwordthatisnotsqlatall":     "",
	} {
		if got := operationName(sql); got != want {
			t.Errorf("operationName(%q) = %q, want %q", sql, got, want)
		}
	}
}
