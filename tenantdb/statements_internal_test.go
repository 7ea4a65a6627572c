package tenantdb

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// encode joins the encodings of msgs.
func encode(t *testing.T, msgs ...interface{ Encode([]byte) ([]byte, error) }) []byte {
	t.Helper()
	var buf []byte
	for _, m := range msgs {
		var err error
		if buf, err = m.Encode(buf); err != nil {
			t.Fatal(err)
		}
	}
	return buf
}

// split cuts buf into its messages, by type.
func split(buf []byte) (types []byte) {
	for len(buf) >= 5 {
		size := 1 + int(binary.BigEndian.Uint32(buf[1:5]))
		types = append(types, buf[0])
		buf = buf[size:]
	}
	return types
}

// sortAll passes the server's replies through sortReply and returns what
// pgx sees.
func sortAll(w *wireConn, replies []byte) []byte {
	var out []byte
	for len(replies) >= 5 {
		size := 1 + int(binary.BigEndian.Uint32(replies[1:5]))
		out = append(out, w.sortReply(replies[:size])...)
		replies = replies[size:]
	}
	return out
}

func row(oid uint32) *pgproto3.RowDescription {
	return &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("v"), DataTypeOID: oid, TypeModifier: -1, TableOID: 99}}}
}

// TestRecreatedStatementRepliesAreDropped follows one statement of pgx's
// through a reset: its Parse is put again, with the parameter types the
// server described, in front of its first Bind after the reset, the replies
// to it are dropped and pgx's are passed; a Bind before the reset, or a
// second one after, gets nothing in front; changed columns turn the
// statement's replies into one error before ReadyForQuery.
func TestRecreatedStatementRepliesAreDropped(t *testing.T) {
	w := &wireConn{stmts: map[string]*namedStatement{}}
	w.mu.Lock()
	defer w.mu.Unlock()
	prepare := encode(t, &pgproto3.Parse{Name: "stmtcache_1", Query: "select $1"}, &pgproto3.Describe{ObjectType: 'S', Name: "stmtcache_1"}, &pgproto3.Sync{})
	if got := w.trackWrite(prepare); !bytes.Equal(got, prepare) {
		t.Fatalf("the prepare was changed: %q", split(got))
	}
	described := encode(t, &pgproto3.ParseComplete{}, &pgproto3.ParameterDescription{ParameterOIDs: []uint32{23}}, row(23), &pgproto3.ReadyForQuery{TxStatus: 'I'})
	if got := sortAll(w, described); !bytes.Equal(got, described) {
		t.Fatalf("pgx saw %q of the prepare's replies, want all", split(got))
	}
	run := encode(t, &pgproto3.Bind{PreparedStatement: "stmtcache_1"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	if got := w.trackWrite(run); !bytes.Equal(got, run) {
		t.Fatalf("a Bind before any reset got %q", split(got))
	}
	ran := encode(t, &pgproto3.BindComplete{}, &pgproto3.DataRow{Values: [][]byte{[]byte("1")}}, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	if got := sortAll(w, ran); !bytes.Equal(got, ran) {
		t.Fatalf("pgx saw %q of the run's replies, want all", split(got))
	}

	w.epoch++ // a reset dropped the server's statements
	got := w.trackWrite(run)
	if want := "PDBES"; string(split(got)) != want {
		t.Fatalf("after a reset the write is %q, want %q", split(got), want)
	}
	var p pgproto3.Parse
	if err := p.Decode(got[5 : 1+binary.BigEndian.Uint32(got[1:5])]); err != nil || p.Name != "stmtcache_1" || len(p.ParameterOIDs) != 1 || p.ParameterOIDs[0] != 23 {
		t.Fatalf("re-created with %+v (%v), want the parameter type the server described", p, err)
	}
	replies := append(encode(t, &pgproto3.ParseComplete{}, &pgproto3.ParameterDescription{ParameterOIDs: []uint32{23}}, row(23)), ran...)
	replies = append(encode(t, &pgproto3.NoticeResponse{Message: "hi"}), replies...)
	if got := sortAll(w, replies); string(split(got)) != "N2DCZ" {
		t.Fatalf("pgx saw %q, want its own replies and the notice", split(got))
	}
	if got := w.trackWrite(run); !bytes.Equal(got, run) {
		t.Fatalf("a second Bind after the reset got %q", split(got))
	}
	sortAll(w, ran)

	w.epoch++
	w.trackWrite(run)
	changed := append(encode(t, &pgproto3.ParseComplete{}, &pgproto3.ParameterDescription{ParameterOIDs: []uint32{23}}, row(700)), ran...)
	out := sortAll(w, changed)
	if string(split(out)) != "EZ" {
		t.Fatalf("with changed columns pgx saw %q, want an error and ReadyForQuery", split(out))
	}
	var e pgproto3.ErrorResponse
	if err := e.Decode(out[5 : len(out)-6]); err != nil || e.Code != "0A000" {
		t.Fatalf("the error is %+v (%v), want SQLSTATE 0A000", e, err)
	}
	if w.owed() != 0 || w.poisoned != nil {
		t.Fatalf("%d replies still owed, poisoned %v: want none", w.owed(), w.poisoned)
	}
}

// TestRecreationSkippedByAnErrorIsRecreatedAgain: when an error before the
// re-created Parse makes the server skip it, the statement is still lost to
// the server, and its next use puts the Parse in front again.
func TestRecreationSkippedByAnErrorIsRecreatedAgain(t *testing.T) {
	w := &wireConn{stmts: map[string]*namedStatement{}}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.trackWrite(encode(t, &pgproto3.Parse{Name: "s1", Query: "select 1"}, &pgproto3.Describe{ObjectType: 'S', Name: "s1"}, &pgproto3.Sync{}))
	sortAll(w, encode(t, &pgproto3.ParseComplete{}, &pgproto3.ParameterDescription{}, row(23), &pgproto3.ReadyForQuery{TxStatus: 'I'}))
	w.epoch++
	batch := encode(t, &pgproto3.Parse{Query: "select 1/0"}, &pgproto3.Bind{}, &pgproto3.Execute{},
		&pgproto3.Bind{PreparedStatement: "s1"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	if got := split(w.trackWrite(batch)); string(got) != "PBEPDBES" {
		t.Fatalf("the batch went as %q", got)
	}
	failed := encode(t, &pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, &pgproto3.ErrorResponse{Code: "22012"}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	if got := split(sortAll(w, failed)); string(got) != "12EZ" {
		t.Fatalf("pgx saw %q", got)
	}
	if got := split(w.trackWrite(encode(t, &pgproto3.Bind{PreparedStatement: "s1"}, &pgproto3.Execute{}, &pgproto3.Sync{}))); string(got) != "PDBES" {
		t.Fatalf("the next use went as %q, want the Parse again in front", got)
	}
}

// TestUnreadableWriteStopsRecreation: a write that ends inside a message
// whose content matters leaves the wire unable to follow pgx's statements:
// it inserts nothing until the next change of tenant starts afresh.
func TestUnreadableWriteStopsRecreation(t *testing.T) {
	w := &wireConn{stmts: map[string]*namedStatement{}}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.trackWrite(encode(t, &pgproto3.Parse{Name: "s1", Query: "select 1"}, &pgproto3.Sync{}))
	sortAll(w, encode(t, &pgproto3.ParseComplete{}, &pgproto3.ReadyForQuery{TxStatus: 'I'}))
	w.epoch++
	bind := encode(t, &pgproto3.Bind{PreparedStatement: "s1"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	if got := w.trackWrite(bind[:8]); !bytes.Equal(got, bind[:8]) {
		t.Fatalf("a cut Bind went as %q", got)
	}
	if got := w.trackWrite(bind[8:]); !bytes.Equal(got, bind[8:]) {
		t.Fatalf("the rest of a cut Bind went as %q", got)
	}
	if got := w.trackWrite(bind); !bytes.Equal(got, bind) || w.owed() != 0 {
		t.Fatalf("after an unreadable write, a Bind went as %q with %d replies owed; want it unchanged, none", split(got), w.owed())
	}
	w.mu.Unlock()
	if !w.untrackedStatements() || w.untrackedStatements() {
		t.Fatal("untrackedStatements did not report the loss once")
	}
	w.mu.Lock()
	if len(w.stmts) != 0 {
		t.Fatalf("%d statements kept after the loss", len(w.stmts))
	}
}

// TestDescribedColumns checks what a re-created statement's columns are
// compared by: names, types and type modifiers count; the table a column
// came from (which differs between two tenants' schemas) and the format do
// not; a truncated description matches no readable one.
func TestDescribedColumns(t *testing.T) {
	rd := func(fields ...pgproto3.FieldDescription) []byte {
		return encode(t, &pgproto3.RowDescription{Fields: fields})
	}
	f := func(name string, table, typ uint32, mod int32) pgproto3.FieldDescription {
		return pgproto3.FieldDescription{Name: []byte(name), TableOID: table, DataTypeOID: typ, TypeModifier: mod, DataTypeSize: -1}
	}
	base := describedColumns(nil, rd(f("id", 1, 23, -1), f("price", 1, 1700, 655366)))
	if len(base) == 0 {
		t.Fatal("no columns read")
	}
	same := rd(f("id", 2, 23, -1), f("price", 2, 1700, 655366))
	if got := describedColumns(nil, same); !bytes.Equal(got, base) {
		t.Errorf("another table's columns of the same names and types differ: %q vs %q", got, base)
	}
	for name, other := range map[string][]byte{
		"type":      rd(f("id", 1, 20, -1), f("price", 1, 1700, 655366)),
		"modifier":  rd(f("id", 1, 23, -1), f("price", 1, 1700, 655367)),
		"name":      rd(f("id", 1, 23, -1), f("cost", 1, 1700, 655366)),
		"a column":  rd(f("id", 1, 23, -1)),
		"no data":   encode(t, &pgproto3.NoData{}),
		"truncated": same[:len(same)-3],
	} {
		if got := describedColumns(nil, other); bytes.Equal(got, base) {
			t.Errorf("%s: the columns compare equal to the original's", name)
		}
	}
	if got := describedColumns([]byte("old"), encode(t, &pgproto3.NoData{})); string(got) != "old" {
		t.Errorf("NoData appended %q", got)
	}
}
