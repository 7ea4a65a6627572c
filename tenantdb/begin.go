package tenantdb

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"strings"
)

// WithLocalSettings returns the simple-protocol query that runs sql with
// local, the statement of Slot.LocalSettings, in front of it in the same
// transaction: first, or right after a leading BEGIN or START TRANSACTION,
// which must come before any other statement of its transaction (its
// isolation level would fail after one) and turns the query's implicit
// transaction into the explicit one that the statements after it, in this
// query and later ones, run in. With several transactions in sql, only the
// first gets the settings.
func WithLocalSettings(sql, local string) string {
	end, ok := leadingBegin(sql)
	if !ok {
		return local + ";\n" + sql
	}
	q := sql[:end] + ";\n" + local
	if end < len(sql) && strings.TrimSpace(sql[end+1:]) != "" {
		q += ";\n" + sql[end+1:]
	}
	return q
}

// leadingBegin reports whether sql's first statement, after spaces and
// comments, is BEGIN or START TRANSACTION, and where it ends: at its
// semicolon, or at the end of sql. Those statements hold keywords only, no
// string or quoted name that could hide a semicolon.
func leadingBegin(sql string) (end int, ok bool) {
	i := skipSpace(sql, 0)
	j := i
	for j < len(sql) && (sql[j] == '_' || 'a' <= sql[j]|0x20 && sql[j]|0x20 <= 'z') {
		j++
	}
	if word := strings.ToLower(sql[i:j]); word != "begin" && word != "start" {
		return 0, false
	}
	for j < len(sql) {
		if k := skipSpace(sql, j); k > j {
			j = k
			continue
		}
		if sql[j] == ';' {
			return j, true
		}
		j++
	}
	return len(sql), true
}

// skipSpace returns the index of the first byte at or after i that is
// neither a space nor in a comment (-- to the end of the line, or /* */,
// which nest in PostgreSQL).
func skipSpace(sql string, i int) int {
	for i < len(sql) {
		switch {
		case sql[i] == ' ' || sql[i] == '\t' || sql[i] == '\n' || sql[i] == '\r' || sql[i] == '\f':
			i++
		case strings.HasPrefix(sql[i:], "--"):
			if n := strings.IndexByte(sql[i:], '\n'); n >= 0 {
				i += n + 1
			} else {
				i = len(sql)
			}
		case strings.HasPrefix(sql[i:], "/*"):
			depth := 0
			for i < len(sql) {
				if strings.HasPrefix(sql[i:], "/*") {
					depth, i = depth+1, i+2
				} else if strings.HasPrefix(sql[i:], "*/") {
					depth, i = depth-1, i+2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
		default:
			return i
		}
	}
	return i
}

// BeginsTransaction reports whether sql's first statement, after spaces and
// comments, is BEGIN or START TRANSACTION: for an adapter that must place
// the tenant's values after it (see WithLocalSettings) or refuse it.
func BeginsTransaction(sql string) bool {
	_, ok := leadingBegin(sql)
	return ok
}

// beginOnly reports whether sql is a BEGIN or START TRANSACTION alone.
func beginOnly(sql string) bool {
	end, ok := leadingBegin(sql)
	return ok && (end == len(sql) || skipSpace(sql, end+1) == len(sql))
}

// afterBegin is the results of a batch whose second query is the tenant's
// setting, sent after the batch's own BEGIN: its result is read here, when
// the caller moves past the BEGIN's.
type afterBegin struct {
	pgx.BatchResults
	read int
}

// next counts a result the caller reads, and reads the setting's result
// first when the caller moves to the batch's second query.
func (b *afterBegin) next() error {
	b.read++
	if b.read != 2 {
		return nil
	}
	_, err := b.BatchResults.Exec()
	return err
}

func (b *afterBegin) Exec() (pgconn.CommandTag, error) {
	if err := b.next(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return b.BatchResults.Exec()
}

func (b *afterBegin) Query() (pgx.Rows, error) {
	if err := b.next(); err != nil {
		return errRows{err}, err
	}
	return b.BatchResults.Query()
}

func (b *afterBegin) QueryRow() pgx.Row {
	if err := b.next(); err != nil {
		return errRow{err}
	}
	return b.BatchResults.QueryRow()
}
