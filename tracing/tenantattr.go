package tracing

import (
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
)

// maxTenantAttrLen bounds the tenant ID put on a span, in bytes.
const maxTenantAttrLen = 256

// tenantAttr returns id as a TenantKey attribute, cut to maxTenantAttrLen at
// a character boundary, or false when id is empty, not valid UTF-8 or holds
// a control character: such an ID names no tenant (the Gate refuses it), and
// invalid UTF-8 in one attribute fails the export of a whole batch of spans.
// It runs before the Gate has validated the ID, which is why it checks.
func tenantAttr(id string) (attribute.KeyValue, bool) {
	if id == "" || !utf8.ValidString(id) {
		return attribute.KeyValue{}, false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x20 || c == 0x7f {
			return attribute.KeyValue{}, false
		}
	}
	if len(id) > maxTenantAttrLen {
		cut := maxTenantAttrLen
		for cut > 0 && !utf8.RuneStart(id[cut]) {
			cut--
		}
		id = id[:cut]
	}
	return TenantKey.String(id), true
}
