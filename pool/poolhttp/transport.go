package poolhttp

import (
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/tenantdb/tenantdb/pool"
)

// ErrNoTenant is returned (wrapped, inside the *url.Error an http.Client
// adds) by Transport for a request whose context carries no tenant. Such a
// call is refused rather than counted against a shared bucket. It is
// pool.ErrNoTenant, the sentinel every adapter shares.
var ErrNoTenant = pool.ErrNoTenant

// Transport is an http.RoundTripper that admits every outbound request
// against Gate for the tenant in the request's context (pool.WithTenant,
// tenantdb.WithTenant), before Base sends it. The slot is held until the
// response body reaches EOF or is closed, whichever comes first (net/http
// frees the connection at EOF too); it is released at once when the response
// has no body (a 204, a HEAD) or Base returns an error. A caller that neither
// reads a body to its end nor closes it keeps its tenant's slot, as it would
// keep the connection. A protocol upgrade (101) holds it until Close.
//
// A request that is not admitted is not sent; RoundTrip returns ErrNoTenant
// (no tenant in context) or Gate.Acquire's error: an *pool.OverLimitError
// when the tenant is over its cap, a context error when the request's context
// ends first. The request's context governs the wait for a slot as well as
// the call.
type Transport struct {
	// Gate admits the calls; its plans are the per-tenant shares of the
	// remote's quota, its capacity the whole quota. Required.
	Gate *pool.Gate
	// Base sends admitted requests. Default http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	id, ok := pool.TenantFrom(req.Context())
	if !ok {
		closeBody(req)
		return nil, fmt.Errorf("poolhttp: %w in request context: %s %s", ErrNoTenant, req.Method, req.URL.Redacted())
	}
	permit, err := t.Gate.Acquire(req.Context(), id)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := roundTrip(base, req, permit)
	if err != nil || resp == nil || resp.Body == nil || resp.Body == http.NoBody {
		permit.Release()
		return resp, err
	}
	rb := &releasingBody{ReadCloser: resp.Body, permit: permit}
	if rw, ok := resp.Body.(io.ReadWriteCloser); ok {
		resp.Body = &releasingReadWriter{releasingBody: rb, w: rw} // 101 Switching Protocols
	} else {
		resp.Body = &releasingAtEOF{rb}
	}
	return resp, nil
}

// roundTrip calls base, releasing permit if base panics.
func roundTrip(base http.RoundTripper, req *http.Request, permit pool.Permit) (resp *http.Response, err error) {
	done := false
	defer func() {
		if !done {
			permit.Release()
		}
	}()
	resp, err = base.RoundTrip(req)
	done = true
	return resp, err
}

// closeBody closes a request body RoundTrip will not send, as the
// http.RoundTripper contract asks.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// releasingBody releases its permit when closed, once.
type releasingBody struct {
	io.ReadCloser
	permit pool.Permit
	once   sync.Once
}

func (b *releasingBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.permit.Release)
	return err
}

// releasingAtEOF also releases its permit when a read reaches EOF.
type releasingAtEOF struct{ *releasingBody }

func (b *releasingAtEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.permit.Release)
	}
	return n, err
}

// releasingReadWriter keeps a writable body (a protocol upgrade) writable.
type releasingReadWriter struct {
	*releasingBody
	w io.Writer
}

func (b *releasingReadWriter) Write(p []byte) (int, error) { return b.w.Write(p) }
