package tenantdb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestResetDropsBufferedNotifications: pgx buffers a notification that
// arrives during a query; the next tenant on the connection must not get
// the previous one's from WaitForNotification. A session that notifies a
// channel it listens to receives the notification at commit, before the
// query's end, so tenant a's is buffered without any timing.
func TestResetDropsBufferedNotifications(t *testing.T) {
	p := newPool(t, sharedPG, 1, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}}})
	err := p.AcquireFunc(as("a"), func(c tenantdb.Conn) error {
		_, err := c.Exec(context.Background(), "listen secrets; notify secrets, 'of tenant a'")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = p.AcquireFunc(as("b"), func(c tenantdb.Conn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		n, err := c.Conn().WaitForNotification(ctx)
		if n != nil {
			t.Errorf("tenant b received tenant a's notification %q on channel %q", n.Payload, n.Channel)
			return nil
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
