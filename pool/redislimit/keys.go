package redislimit

import "strings"

// keys names a tenant's keys and channel. They all begin with the hash tag
// "{prefix:tenant}" so that Redis Cluster keeps them in one slot, which the
// scripts need (a script may only touch keys of one slot) and which keeps a
// tenant's traffic on one node. Braces inside a tenant ID only shorten the
// tag; it is still the same for all of that tenant's keys.
type keys struct {
	slots   string // sorted set: lease member -> expiry (ms, Redis clock)
	waiting string // string with a PX expiry: some process has waiters
	channel string // pub/sub channel: a release publishes the slots it freed
}

// tenantEscaper escapes the tenant ID so that it holds no ':': the last ':'
// of the tag then always ends the prefix, and two deployments whose prefixes
// differ never share a key ("billing" + "eu:acme" against "billing:eu" +
// "acme"). IDs without '%' or ':' keep their old keys.
var tenantEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

func tenantKeys(prefix, tenant string) keys {
	base := "{" + prefix + ":" + tenantEscaper.Replace(tenant) + "}:"
	return keys{slots: base + "slots", waiting: base + "waiting", channel: base + "free"}
}
