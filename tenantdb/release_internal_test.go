package tenantdb

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestContainsAll(t *testing.T) {
	for _, c := range []struct {
		names, was string
		want       bool
	}{
		{"", "", true},
		{"a,b,c", "", true},
		{"a,b,c", "a,c", true},
		{"a,b,c", "a,b,c", true},
		{"a,c", "b", false},
		{"a,b", "a,b,c", false},
		{"", "a", false},
		{"stmtcache_1,stmtcache_2", "stmtcache_2", true},
	} {
		if got := containsAll(c.names, c.was); got != c.want {
			t.Errorf("containsAll(%q, %q) = %v, want %v", c.names, c.was, got, c.want)
		}
	}
}

func TestContainsFold(t *testing.T) {
	for _, c := range []struct {
		s    string
		want bool
	}{
		{"DEALLOCATE ALL", true},
		{"select 1; DeAllocate stmtcache_x", true},
		{"deallocat", false},
		{"select 'deallocate'", true}, // a false alarm costs a re-prepare, never a leak
		{"select 1", false},
	} {
		if got := containsFold(c.s, "deallocate"); got != c.want {
			t.Errorf("containsFold(%q) = %v, want %v", c.s, got, c.want)
		}
	}
}

// TestBenchCountsTheReset: the statements whose server instructions
// bench/resetir_test.go counts one by one are resetStatements'.
func TestBenchCountsTheReset(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "bench", "resetir_test.go"))
	if err != nil {
		t.Skipf("the bench module is not beside this one: %v", err)
	}
	_, list, ok := strings.Cut(string(src), "var resetParts = []string{\n")
	list, _, ok2 := strings.Cut(list, "\n}")
	if !ok || !ok2 {
		t.Fatal("bench/resetir_test.go has no resetParts list")
	}
	var parts []string
	for _, line := range strings.Split(list, "\n") {
		parts = append(parts, strings.TrimSuffix(strings.Trim(strings.TrimSpace(line), `"`), `",`))
	}
	if got := strings.Join(parts, "; "); got != resetStatements {
		t.Fatalf("bench/resetir_test.go counts\n%s\nbut the reset is\n%s", got, resetStatements)
	}
}
