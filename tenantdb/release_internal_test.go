package tenantdb

import "testing"

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
