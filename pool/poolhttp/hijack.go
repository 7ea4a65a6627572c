package poolhttp

import (
	"bufio"
	"net"
	"net/http"
	"sync"
)

// hijackable passes a ResponseWriter on to the handler and, when the handler
// hijacks the connection, moves the request's slot to that connection: it is
// released when the connection is closed, not when the handler returns, so a
// websocket-style session goes on counting against its tenant's cap.
type hijackable struct {
	http.ResponseWriter
	release  func()
	hijacked bool // set in the handler's goroutine, read after it returns
}

// trackHijack wraps w when it can be hijacked (HTTP/1); other writers are
// returned as they are. The result keeps w's Flush.
func trackHijack(w http.ResponseWriter, release func()) (http.ResponseWriter, *hijackable) {
	if _, ok := w.(http.Hijacker); !ok {
		return w, nil
	}
	h := &hijackable{ResponseWriter: w, release: release}
	if _, ok := w.(http.Flusher); ok {
		return flushingHijackable{h}, h
	}
	return h, h
}

// Unwrap lets http.ResponseController reach the writer's other methods.
func (h *hijackable) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// Hijack implements http.Hijacker; the connection it returns releases the
// slot when closed, once.
func (h *hijackable) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return c, brw, err
	}
	h.hijacked = true
	return &releasingConn{Conn: c, release: h.release}, brw, nil
}

type flushingHijackable struct{ *hijackable }

func (f flushingHijackable) Flush() { f.ResponseWriter.(http.Flusher).Flush() }

// releasingConn releases its slot when closed, once.
type releasingConn struct {
	net.Conn
	release func()
	once    sync.Once
}

func (c *releasingConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
