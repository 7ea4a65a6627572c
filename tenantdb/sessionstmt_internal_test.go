package tenantdb

import "testing"

// TestTrimSessionStatement undoes WithLocalSettings for the statements
// tenantdb builds, with tenant IDs that hold quotes, backslashes and
// semicolons.
func TestTrimSessionStatement(t *testing.T) {
	local := "select " + setConfig("role", quoteLiteral(`ten;ant'\x`), true) + ", " +
		setConfig("app.tenant_id", quoteLiteral(`a';select 1;--`), true)
	if !IsSessionStatement(local) || IsSessionStatement("select 1") {
		t.Fatal("IsSessionStatement")
	}
	for _, sql := range []string{
		"select 1",
		"select * from orders where note = ';'",
		"BEGIN",
		"begin isolation level serializable; insert into t values (1); commit",
		"START TRANSACTION;\nselect 2",
	} {
		if got := TrimSessionStatement(WithLocalSettings(sql, local)); got != sql {
			t.Errorf("TrimSessionStatement(WithLocalSettings(%q)) = %q", sql, got)
		}
		if got := TrimSessionStatement(sql); got != sql {
			t.Errorf("TrimSessionStatement(%q) = %q, want it unchanged", sql, got)
		}
	}
	if got := TrimSessionStatement(local); got != "" {
		t.Errorf("the statement alone: %q, want empty", got)
	}
}
