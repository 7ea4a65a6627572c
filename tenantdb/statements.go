package tenantdb

import (
	"bytes"
	"encoding/binary"
	"errors"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A change of tenant sends DISCARD ALL, which drops every prepared
// statement, the previous holder's and pgx's alike, so that no statement a
// holder's SQL prepared (or replaced under one of pgx's names) can reach the
// next one. pgx still believes its statements exist, and preparing them
// again through pgx would cost a round trip each, so the wire re-creates
// them itself: it keeps the Parse message pgx sent for each named
// statement, and puts it, with a Describe, in front of the first message
// that uses the statement after a reset, in the same write. The replies to
// those messages are read off the stream before pgx sees it.
//
// The statement is parsed again in the new holder's session, with the
// parameter types the server gave it the first time, and its result columns
// are compared with the ones pgx cached: where they differ (a schema change,
// or a search_path that differs by tenant), the server has already run the
// statement, so pgx gets errColumnsChanged for it, which also makes pgx drop
// it from its cache, instead of rows it would decode with the wrong types.

// namedStatement is one statement that pgx prepared under a name.
type namedStatement struct {
	parse    []byte // the Parse message to send again: pgx's, with the parameter types once described
	describe []byte // the Describe message of the statement, sent after parse
	columns  []byte // the result columns the server described (names, types, modifiers)
	known    bool   // columns holds the server's first description
	epoch    int    // the reset epoch in which the server holds it; -1 when it does not
}

// reply is a reply the server still owes, in order, for a message written
// after the last reset: its kind is the frontend message's type ('P', 'B',
// 'D', 'E', 'C', 'S' for Sync, 'Q', 'F'), with what is sorted by it.
type reply struct {
	kind   byte
	portal bool            // a Describe of a portal, which has no ParameterDescription
	ours   bool            // a message the wire inserted: its replies are dropped
	stmt   *namedStatement // for a Parse or a Describe of a named statement
}

// errColumnsChanged is returned for a statement re-created after a change of
// tenant whose result columns are no longer those pgx cached.
var errColumnsChanged = errors.New("tenantdb: a prepared statement re-created after a change of tenant " +
	"describes other result columns than pgx cached (a schema change, or a search_path that differs by tenant); " +
	"the server ran it, and pgx prepares it again on its next use")

// trackWrite reads pgx's messages in p, keeps its named statements, and
// returns p with the re-creation of statements that the server lost in a
// reset put in front of their first use; each message written gets its
// replies on w.replies. Called with mu held.
func (w *wireConn) trackWrite(p []byte) []byte {
	if w.untracked {
		return p
	}
	var out []byte // nil while nothing is inserted: p goes as it is
	done := 0      // bytes of p already copied to out
	for off := 0; off < len(p); {
		if w.scanLeft > 0 { // the rest of a message an earlier write began
			n := min(w.scanLeft, len(p)-off)
			w.scanLeft -= n
			off += n
			continue
		}
		if w.startup { // the untyped startup message, or an SSL or cancel request
			if len(p)-off < 4 {
				w.lose()
				return p
			}
			size := int(binary.BigEndian.Uint32(p[off:]))
			w.startup = false
			w.scanLeft = max(size-(len(p)-off), 0)
			off += min(size, len(p)-off)
			continue
		}
		if len(p)-off < 5 {
			w.lose()
			return p
		}
		size := 1 + int(binary.BigEndian.Uint32(p[off+1:]))
		t := p[off]
		if off+size > len(p) {
			if t == 'P' || t == 'B' || t == 'D' || t == 'C' || t == 'Q' {
				w.lose() // a message split across writes: pgx never does that
			}
			w.scanLeft = off + size - len(p)
			w.pushReply(reply{kind: t})
			break
		}
		msg := p[off : off+size]
		var use *namedStatement // a statement this message uses that the server lost
		switch t {
		case 'P':
			if name, ok := cstring(msg, 5); ok && len(name) > 0 {
				s := &namedStatement{parse: bytes.Clone(msg), epoch: w.epoch}
				s.describe, _ = (&pgproto3.Describe{ObjectType: 'S', Name: string(name)}).Encode(nil)
				w.stmts[string(name)] = s
				w.pushReply(reply{kind: 'P', stmt: s})
				off += size
				continue
			}
		case 'B':
			if portal, ok := cstring(msg, 5); ok {
				if name, ok := cstring(msg, 5+len(portal)+1); ok && len(name) > 0 {
					use = w.lostStatement(name)
				}
			}
		case 'D':
			if size > 6 && msg[5] == 'S' {
				if name, ok := cstring(msg, 6); ok && len(name) > 0 {
					use = w.lostStatement(name)
					if use == nil {
						w.pushReply(reply{kind: 'D', stmt: w.stmts[string(name)]})
						off += size
						continue
					}
				}
			}
		case 'C':
			if size > 6 && msg[5] == 'S' {
				if name, ok := cstring(msg, 6); ok && len(name) > 0 {
					delete(w.stmts, string(name))
				}
			}
		case 'Q':
			if q, ok := cstring(msg, 5); ok && isDeallocateAll(q) {
				clear(w.stmts) // pgx's DeallocateAll: its caches are empty too
			}
		}
		if use != nil {
			if out == nil {
				out = make([]byte, 0, len(p)+len(use.parse)+64)
			}
			out = append(out, p[done:off]...)
			out = append(out, use.parse...)
			out = append(out, use.describe...)
			done = off
			use.epoch = w.epoch
			w.pushReply(reply{kind: 'P', ours: true, stmt: use})
			w.pushReply(reply{kind: 'D', ours: true, stmt: use})
			if t == 'D' {
				// pgx's own Describe of it, after ours.
				w.pushReply(reply{kind: 'D', stmt: use})
				off += size
				continue
			}
		}
		switch t {
		case 'P', 'B', 'E', 'C', 'S', 'Q', 'F':
			w.pushReply(reply{kind: t})
		case 'D':
			w.pushReply(reply{kind: 'D', portal: size > 6 && msg[5] == 'P'})
		}
		off += size
	}
	if out == nil {
		return p
	}
	return append(out, p[done:]...)
}

// lostStatement returns the statement named name if pgx prepared it and the
// server lost it in a reset since, else nil. Called with mu held.
func (w *wireConn) lostStatement(name []byte) *namedStatement {
	if s := w.stmts[string(name)]; s != nil && s.epoch != w.epoch {
		return s
	}
	return nil
}

// lose gives up re-creating statements on this connection: a write could not
// be read. The next change of tenant empties pgx's caches instead (see
// readySession). Called with mu held.
func (w *wireConn) lose() {
	w.untracked = true
	w.replies, w.replyHead = w.replies[:0], 0
}

// pushReply records a reply the server owes. Called with mu held.
func (w *wireConn) pushReply(r reply) {
	if !w.untracked {
		w.replies = append(w.replies, r)
	}
}

// owed is how many replies the server still owes. Called with mu held.
func (w *wireConn) owed() int {
	return len(w.replies) - w.replyHead
}

// popReply removes the oldest reply owed. Called with mu held.
func (w *wireConn) popReply() {
	w.replyHead++
	if w.replyHead == len(w.replies) {
		w.replies, w.replyHead = w.replies[:0], 0
	}
}

// skipToSync drops the replies owed for the messages that the server skips
// after an error: those up to the next Sync. Called with mu held.
func (w *wireConn) skipToSync() {
	for w.owed() > 0 && w.replies[w.replyHead].kind != 'S' {
		if r := w.replies[w.replyHead]; r.kind == 'P' && r.stmt != nil {
			r.stmt.epoch = -1 // skipped: the server does not hold it
		}
		w.popReply()
	}
}

// sortReply decides whether pgx sees msg, a whole message of the server
// after the reset's replies, and keeps the description of pgx's statements.
// It returns what pgx is to see instead of it (nil to drop it, msg to pass
// it). Called with mu held.
func (w *wireConn) sortReply(msg []byte) []byte {
	t := msg[0]
	if t == 'N' || t == 'A' || t == 'S' { // notice, notification, ParameterStatus: any time
		return msg
	}
	if w.owed() == 0 {
		return w.spoiled(msg)
	}
	head := &w.replies[w.replyHead]
	if t == 'E' && head.kind != 'Q' && head.kind != 'F' && head.kind != 'S' {
		w.skipToSync()
		return w.spoiled(msg)
	}
	switch head.kind {
	case 'P':
		if t == '1' {
			ours := head.ours
			w.popReply()
			if ours {
				return nil
			}
		}
	case 'B':
		if t == '2' {
			w.popReply()
		}
	case 'D':
		if t == 't' && !head.portal {
			if head.ours {
				return nil
			}
			if s := head.stmt; s != nil && !s.known {
				s.parse = withParamTypes(s.parse, msg)
			}
			return w.spoiled(msg)
		}
		if t == 'T' || t == 'n' {
			r := *head
			w.popReply()
			if r.stmt != nil && !r.portal {
				w.columns = describedColumns(w.columns[:0], msg)
				switch {
				case r.ours && r.stmt.known && !bytes.Equal(w.columns, r.stmt.columns):
					w.poisoned = errColumnsChanged
				case !r.ours && !r.stmt.known:
					r.stmt.columns, r.stmt.known = bytes.Clone(w.columns), true
				}
			}
			if r.ours {
				return nil
			}
		}
	case 'E':
		if t == 'C' || t == 'I' || t == 's' {
			w.popReply()
		}
	case 'C':
		if t == '3' {
			w.popReply()
		}
	case 'S', 'Q', 'F':
		if t == 'Z' {
			w.popReply()
			if w.poisoned != nil {
				err := w.poisoned
				w.poisoned = nil
				e := pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "0A000", Message: err.Error()}
				out, _ := e.Encode(nil)
				return append(out, msg...)
			}
		}
	}
	return w.spoiled(msg)
}

// spoiled passes msg to pgx unless a re-created statement's columns changed
// in the messages it belongs to: then every reply up to their ReadyForQuery
// gives way to the error. Called with mu held.
func (w *wireConn) spoiled(msg []byte) []byte {
	if w.poisoned != nil {
		return nil
	}
	return msg
}

// cstring reads the NUL-terminated string at off in msg.
func cstring(msg []byte, off int) ([]byte, bool) {
	if off > len(msg) {
		return nil, false
	}
	i := bytes.IndexByte(msg[off:], 0)
	if i < 0 {
		return nil, false
	}
	return msg[off : off+i], true
}

// isDeallocateAll reports whether q is pgx's DeallocateAll statement.
func isDeallocateAll(q []byte) bool {
	return bytes.EqualFold(q, []byte("deallocate all"))
}

// withParamTypes returns the Parse message parse with the parameter types of
// desc, the server's ParameterDescription of it, so that the statement is
// parsed again with the types pgx encodes its arguments in.
func withParamTypes(parse, desc []byte) []byte {
	var pd pgproto3.ParameterDescription
	var p pgproto3.Parse
	if pd.Decode(desc[5:]) != nil || p.Decode(parse[5:]) != nil {
		return parse
	}
	p.ParameterOIDs = pd.ParameterOIDs
	out, err := p.Encode(nil)
	if err != nil {
		return parse
	}
	return out
}

// describedColumns appends to dst what pgx decodes a RowDescription by:
// each column's name, type and type modifier (not the table it came from,
// which differs between the schemas of two tenants). NoData is an empty
// result; an unreadable description one that matches no other.
func describedColumns(dst, msg []byte) []byte {
	if msg[0] != 'T' {
		return dst
	}
	body := msg[5:]
	if len(body) < 2 {
		return append(dst, "unreadable"...)
	}
	n := int(binary.BigEndian.Uint16(body))
	body = body[2:]
	for range n {
		name, ok := cstring(body, 0)
		// After the name: table OID (4), column (2), type OID (4), size
		// (2), type modifier (4), format (2).
		if !ok || len(body) < len(name)+1+18 {
			return append(dst[:0], "unreadable"...)
		}
		field := body[len(name)+1:]
		dst = append(append(dst, name...), 0)
		dst = append(dst, field[6:10]...)  // type OID
		dst = append(dst, field[12:16]...) // type modifier
		body = field[18:]
	}
	return dst
}
