package tenantdb

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestResetAloneWhileAReadIsBlocked is pgx's order for a simple-protocol
// query: its background reader is already blocked in Read when the query is
// written. The reset that goes alone in front of it must be read off by that
// reader, not wait for the read to end, which needs the query's own replies
// (a deadlock seen in CI under load).
func TestResetAloneWhileAReadIsBlocked(t *testing.T) {
	client, server := net.Pipe()
	t.Cleanup(func() { client.Close(); server.Close() })
	w := &wireConn{Conn: client}
	w.cond.L = &w.mu

	reset := mustEncode(t, &pgproto3.Query{String: "reset"}) // the content does not matter here
	query := mustEncode(t, &pgproto3.Query{String: "select 1"})
	sync := mustEncode(t, &pgproto3.Sync{})

	// The server: the reset and its Sync, then the query.
	serverErr := make(chan error, 1)
	go func() {
		serverErr <- func() error {
			buf := make([]byte, len(reset)+len(sync))
			if _, err := io.ReadFull(server, buf); err != nil {
				return err
			}
			if _, err := server.Write(concat(t, &pgproto3.CommandComplete{CommandTag: []byte("RESET")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})); err != nil {
				return err
			}
			buf = make([]byte, len(query))
			if _, err := io.ReadFull(server, buf); err != nil {
				return err
			}
			_, err := server.Write(concat(t, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'}))
			return err
		}()
	}()

	// pgx's background reader, left blocked in Read by an earlier statement.
	got := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 64)
		n, err := w.Read(buf)
		if err != nil {
			t.Errorf("read: %v", err)
		}
		got <- buf[:n]
	}()
	for deadline := time.Now().Add(10 * time.Second); ; {
		w.mu.Lock()
		reading := w.reading
		w.mu.Unlock()
		if reading {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reader never started")
		}
		time.Sleep(time.Millisecond)
	}
	// A change of tenant arms the reset; it goes alone, in front of the
	// query's write.
	w.arm(reset, 1, "b", "", true)

	wrote := make(chan error, 1)
	go func() { _, err := w.Write(query); wrote <- err }()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("write: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the write never returned: it waits for a read that waits for it")
	}
	select {
	case b := <-got:
		if len(b) == 0 || b[0] != 'C' {
			t.Fatalf("pgx read %q, want the query's CommandComplete (the reset's replies dropped)", b)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reader never got the query's replies")
	}
	if err := <-serverErr; err != nil {
		t.Fatal(err)
	}
}

func mustEncode(t *testing.T, m pgproto3.FrontendMessage) []byte {
	t.Helper()
	b, err := m.Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func concat(t *testing.T, msgs ...pgproto3.BackendMessage) []byte {
	t.Helper()
	var b []byte
	for _, m := range msgs {
		var err error
		if b, err = m.Encode(b); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// TestNotificationAfterTheLastReplyWaitsForTheHolder: a notification that
// the server sends right after a statement's ReadyForQuery, read in the same
// chunk, would sit in pgx's buffer when the connection is released and reach
// the next holder. The wire keeps it back: the holder gets it when it reads
// again, and a change of tenant drops it.
func TestNotificationAfterTheLastReplyWaitsForTheHolder(t *testing.T) {
	for _, handover := range []bool{false, true} {
		client, server := net.Pipe()
		w := &wireConn{Conn: client, stmts: map[string]*namedStatement{}}
		w.cond.L = &w.mu
		query := mustEncode(t, &pgproto3.Query{String: "select 1"})
		replies := concat(t, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
		note := concat(t, &pgproto3.NotificationResponse{PID: 1, Channel: "secrets", Payload: "of tenant a"})
		go func() {
			buf := make([]byte, len(query))
			if _, err := io.ReadFull(server, buf); err != nil {
				return
			}
			server.Write(append(append([]byte(nil), replies...), note...)) // one chunk
		}()
		if _, err := w.Write(query); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1024)
		n, err := w.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if string(buf[:n]) != string(replies) {
			t.Fatalf("pgx read %q with the query's replies, want them alone %q", buf[:n], replies)
		}
		if handover {
			w.arm(mustEncode(t, &pgproto3.Query{String: "reset"}), 1, "b", "", true)
			w.mu.Lock()
			held := len(w.held)
			w.mu.Unlock()
			if held != 0 {
				t.Errorf("a change of tenant kept %d bytes of the previous holder's notification", held)
			}
		} else {
			n, err := w.Read(buf) // the holder reads on, as WaitForNotification does
			if err != nil {
				t.Fatal(err)
			}
			if string(buf[:n]) != string(note) {
				t.Errorf("the holder read %q, want its notification %q", buf[:n], note)
			}
		}
		client.Close()
		server.Close()
	}
}
