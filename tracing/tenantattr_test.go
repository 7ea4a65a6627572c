package tracing

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestTenantAttrCutsOnACharacterBoundary puts characters of 1 to 4 bytes
// across the maxTenantAttrLen cut, at every offset: the attribute must stay
// valid UTF-8, a prefix of the ID, at most maxTenantAttrLen bytes, and lose
// no more than the character the cut fell in (issue 33's suspicion).
func TestTenantAttrCutsOnACharacterBoundary(t *testing.T) {
	for _, r := range []string{"a", "é", "€", "𝄞"} {
		for pad := maxTenantAttrLen - 4; pad <= maxTenantAttrLen; pad++ {
			id := strings.Repeat("a", pad) + r + "zz"
			kv, ok := tenantAttr(id)
			if !ok {
				t.Fatalf("%q at byte %d: no attribute", r, pad)
			}
			got := kv.Value.AsString()
			want := id[:min(len(id), maxTenantAttrLen)]
			if end := pad + len(r); pad < maxTenantAttrLen && end > maxTenantAttrLen {
				want = id[:pad] // the cut falls inside r
			}
			if !utf8.ValidString(got) || got != want {
				t.Errorf("%q at byte %d: attribute of %d bytes (valid UTF-8 %v), want %d bytes",
					r, pad, len(got), utf8.ValidString(got), len(want))
			}
		}
	}
	if kv, ok := tenantAttr("acme"); !ok || kv.Value.AsString() != "acme" {
		t.Errorf("a short ID: %v, %v", kv, ok)
	}
}
