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

func TestClearTextByDefault(t *testing.T) {
	for _, c := range []struct {
		endpoint string
		want     bool
		err      bool
	}{
		{"localhost:4317", true, false},
		{"127.0.0.1:4318", true, false},
		{"[::1]:4317", true, false},
		{"jaeger:4317", false, false},
		{"10.0.0.5:4317", false, false},
		{"http://jaeger:4318", true, false},
		{"https://localhost:4318", false, false},
		{"jaeger", false, true},
	} {
		got, err := clearTextByDefault(c.endpoint, len(c.endpoint) > 4 && (c.endpoint[:4] == "http"))
		if got != c.want || (err != nil) != c.err {
			t.Errorf("clearTextByDefault(%q) = %v, %v; want %v, error %v", c.endpoint, got, err, c.want, c.err)
		}
	}
}
