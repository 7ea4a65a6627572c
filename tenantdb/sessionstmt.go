package tenantdb

import "strings"

// sessionStatementPrefix begins every statement tenantdb sends to set a
// tenant's values (Config.Session), and only those.
const sessionStatementPrefix = "select pg_catalog.set_config("

// IsSessionStatement reports whether sql is, or begins with, the statement
// tenantdb sends to set a tenant's values (Config.Session): under
// ScopeTransaction the first query of the batch it wraps a call in, or the
// front of a simple-protocol query (WithLocalSettings). Tracers use it to
// name the application's statement rather than tenantdb's.
func IsSessionStatement(sql string) bool {
	return strings.HasPrefix(sql, sessionStatementPrefix)
}

// TrimSessionStatement returns sql without the session statement that
// WithLocalSettings put in it (first, or right after a leading BEGIN or
// START TRANSACTION), so that what remains is the application's SQL; any
// other sql is returned as it is.
func TrimSessionStatement(sql string) string {
	if IsSessionStatement(sql) {
		end, ok := sessionStatementEnd(sql)
		if !ok {
			return sql
		}
		return strings.TrimPrefix(sql[end:], ";\n")
	}
	begin, ok := leadingBegin(sql)
	if !ok || begin >= len(sql) {
		return sql
	}
	rest := strings.TrimPrefix(sql[begin+1:], "\n")
	if !IsSessionStatement(rest) {
		return sql
	}
	end, ok := sessionStatementEnd(rest)
	if !ok {
		return sql
	}
	if tail := strings.TrimPrefix(rest[end:], ";\n"); tail != "" {
		return sql[:begin] + ";" + tail
	}
	return sql[:begin]
}

// sessionStatementEnd returns where the session statement that starts sql
// ends: at its semicolon or at the end of sql. Its values are quoted
// literals (E'...', with backslash and doubled-quote escapes) that may hold
// semicolons, so quotes are skipped; it reports false on an open quote.
func sessionStatementEnd(sql string) (int, bool) {
	quoted := false
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case quoted && c == '\\':
			i++
		case quoted && c == '\'' && i+1 < len(sql) && sql[i+1] == '\'':
			i++
		case c == '\'':
			quoted = !quoted
		case !quoted && c == ';':
			return i, true
		}
	}
	return len(sql), !quoted
}
