package tracing

import "strings"

// maxOperationLen bounds the keyword taken as db.operation.name: longer
// words are not SQL keywords, and an attribute should not carry them.
const maxOperationLen = 20

// operationName returns the first keyword of sql, upper-cased (SELECT,
// INSERT, WITH, BEGIN...), after leading spaces, parentheses and comments;
// "" when sql starts with no keyword. The semantic conventions ask for the
// operation as written, never parsed deeper: a WITH ... SELECT is "WITH".
func operationName(sql string) string {
	return strings.ToUpper(operationKeyword(sql)) // allocates only when sql is lower case
}

// operationKeyword is operationName as written, a substring of sql.
func operationKeyword(sql string) string {
	i := skipNoise(sql)
	j := i
	for j < len(sql) && isASCIILetter(sql[j]) {
		j++
	}
	if j == i || j-i > maxOperationLen {
		return ""
	}
	return sql[i:j]
}

// skipNoise returns the index of the first byte of sql that is not space,
// an opening parenthesis, a semicolon or inside a comment. PostgreSQL block
// comments nest.
func skipNoise(sql string) int {
	i := 0
	for i < len(sql) {
		switch c := sql[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '(' || c == ';':
			i++
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			nl := strings.IndexByte(sql[i:], '\n')
			if nl < 0 {
				return len(sql)
			}
			i += nl + 1
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			depth := 1
			i += 2
			for i < len(sql) && depth > 0 {
				switch {
				case sql[i] == '/' && i+1 < len(sql) && sql[i+1] == '*':
					depth++
					i += 2
				case sql[i] == '*' && i+1 < len(sql) && sql[i+1] == '/':
					depth--
					i += 2
				default:
					i++
				}
			}
		default:
			return i
		}
	}
	return i
}

func isASCIILetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
