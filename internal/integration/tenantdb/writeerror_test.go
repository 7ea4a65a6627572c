package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/pool/poolhttp"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// TestWriteErrorMapsEveryCallError makes a real Pool fail in each way a
// handler meets, and checks the one mapping (tenantdb.HTTPStatus, written by
// tenantdb.WriteError): the status, the Retry-After header where it belongs,
// and a body that holds none of the error's text.
func TestWriteErrorMapsEveryCallError(t *testing.T) {
	p := newPool(t, sharedPG, 4, tenantdb.Config{
		Plans:       map[string]tenantdb.Plan{"p": {MaxConns: 1, MaxWaiting: 1, MaxWait: time.Minute}},
		DefaultPlan: "p",
		Lookup: func(_ context.Context, id string) (tenantdb.Tenant, error) {
			if id == "lookup-down" {
				return tenantdb.Tenant{}, errors.New("dial 10.9.8.7: secret")
			}
			return tenantdb.Tenant{}, nil
		},
	})
	held, err := p.Acquire(as("busy"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()

	type call func() error
	query := func(ctx context.Context, sql string) call {
		return func() error {
			var n int
			return p.QueryRow(ctx, sql).Scan(&n)
		}
	}
	deadline, stopDeadline := context.WithTimeout(as("busy"), 50*time.Millisecond)
	defer stopDeadline()
	cancelled, cancel := context.WithCancel(as("busy"))
	cancelAfterQueued := func() error {
		go func() {
			for p.TenantStat("busy").Waiting != 1 {
				time.Sleep(100 * time.Microsecond) // a probe of the Gate's state, not a wait for time
			}
			cancel()
		}()
		return query(cancelled, "select 1")()
	}
	stmtTimeout := func() error {
		tx, err := p.Begin(as("ok"))
		if err != nil {
			return err
		}
		defer tx.Rollback(as("ok"))
		if _, err := tx.Exec(as("ok"), "set local statement_timeout = 10"); err != nil {
			return err
		}
		_, err = tx.Exec(as("ok"), "select pg_sleep(5)")
		return err
	}
	for _, tc := range []struct {
		name       string
		call       call
		want       int
		retryAfter bool
	}{
		{"ok", query(as("ok"), "select 1"), http.StatusOK, false},
		{"no tenant", query(context.Background(), "select 1"), http.StatusUnauthorized, false},
		{"malformed tenant", query(as("bad\x00id"), "select 1"), http.StatusUnauthorized, false},
		// busy holds its cap of 1; the second request waits in its queue of 1.
		{"deadline while waiting", query(deadline, "select 1"), http.StatusGatewayTimeout, false},
		{"client went away while waiting", cancelAfterQueued, poolhttp.StatusClientClosedRequest, false},
		{"statement_timeout", stmtTimeout, http.StatusGatewayTimeout, false},
		{"syntax error", query(as("ok"), "selec 1"), http.StatusInternalServerError, false},
		{"lookup failed", query(as("lookup-down"), "select 1"), http.StatusServiceUnavailable, false},
		{"unknown class", query(pool.WithClass(as("ok"), "nope"), "select 1"), http.StatusInternalServerError, false},
	} {
		err := tc.call()
		if got := tenantdb.HTTPStatus(err); got != tc.want {
			t.Errorf("%s: HTTPStatus(%v) = %d, want %d", tc.name, err, got, tc.want)
			continue
		}
		if err == nil {
			continue
		}
		rec := httptest.NewRecorder()
		if got := tenantdb.WriteError(rec, err); got != tc.want || rec.Code != tc.want {
			t.Errorf("%s: WriteError returned %d and wrote %d, want %d", tc.name, got, rec.Code, tc.want)
		}
		if (rec.Header().Get("Retry-After") != "") != tc.retryAfter {
			t.Errorf("%s: Retry-After %q", tc.name, rec.Header().Get("Retry-After"))
		}
		if strings.Contains(rec.Body.String(), "secret") || strings.Contains(rec.Body.String(), "selec") {
			t.Errorf("%s: body %q holds the error's text", tc.name, rec.Body.String())
		}
	}

	// Over the cap with a full queue: 429 with Retry-After, as WriteOverLimit.
	queued := make(chan error, 1)
	go func() { queued <- query(as("busy"), "select 1")() }()
	tenantdbWaiting(t, p, "busy", 1)
	err = query(as("busy"), "select 1")()
	rec := httptest.NewRecorder()
	if got := tenantdb.WriteError(rec, err); got != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Errorf("over the cap: %v written as %d, Retry-After %q; want 429 with one", err, got, rec.Header().Get("Retry-After"))
	}
	held.Release()
	if err := <-queued; err != nil {
		t.Fatal(err)
	}

	// A revoked lease, a closed Pool, and a database the tenant has none of.
	if got := tenantdb.HTTPStatus(tenantdb.ErrRevoked); got != http.StatusServiceUnavailable {
		t.Errorf("ErrRevoked: %d, want 503", got)
	}
	p.Close()
	if err := query(as("ok"), "select 1")(); tenantdb.HTTPStatus(err) != http.StatusServiceUnavailable {
		t.Errorf("closed Pool: %v maps to %d, want 503", err, tenantdb.HTTPStatus(err))
	}
	dbs := newPool(t, sharedPG, 2, tenantdb.Config{Database: func(id string) (string, error) {
		return "", errors.New("no such tenant")
	}})
	if err := dbs.Ping(as("ok")); !errors.Is(err, tenantdb.ErrNoDatabase) || tenantdb.HTTPStatus(err) != http.StatusServiceUnavailable {
		t.Errorf("no database: %v maps to %d, want ErrNoDatabase as 503", err, tenantdb.HTTPStatus(err))
	}
}

// tenantdbWaiting waits until n of tenant's calls wait for a slot.
func tenantdbWaiting(t testing.TB, p *tenantdb.Pool, tenant string, n int) {
	t.Helper()
	tenantdbtest.Eventually(t, 10*time.Second, fmt.Sprintf("%d of %s's calls wait", n, tenant),
		func() bool { return p.TenantStat(tenant).Waiting == n })
}
