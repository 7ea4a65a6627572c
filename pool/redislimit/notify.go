package redislimit

import (
	"container/list"
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// notifier wakes waiting requests when another process (or this one)
// releases a slot of their tenant. One pub/sub connection per Limiter carries
// the channels of the tenants that have waiters here; a channel is
// subscribed when its first waiter comes and unsubscribed a while after its
// last one left, so the subscriptions follow the tenants that are contended
// now, not every tenant ever seen.
//
// A waiter relies on a notification only once its subscription is confirmed:
// the SUBSCRIBE is followed on the same connection by a PING whose reply
// (in order after the SUBSCRIBE's) proves that Redis has it. Until then, and
// after the connection was lost, the waiter re-checks instead.
//
// Subscribing and unsubscribing are done by one goroutine (control), so that
// they reach Redis in the order they were decided; messages are read by
// another (receive).
type notifier struct {
	l      *Limiter
	ps     *redis.PubSub
	kick   chan struct{} // wakes control
	linger time.Duration // how long an unwatched channel stays subscribed

	// started is closed before the first SUBSCRIBE: receive connects only
	// then, so a process whose tenants never wait holds no connection.
	started   chan struct{}
	startOnce sync.Once

	mu    sync.Mutex
	chans map[string]*channel // guarded by mu
	seq   uint64              // guarded by mu: the last barrier PING sent
}

// channel is the state of one tenant's channel. All fields are guarded by
// notifier.mu.
type channel struct {
	name      string
	watchers  list.List     // of *watcher, oldest first
	sent      bool          // SUBSCRIBE sent on the current connection
	tracked   bool          // go-redis subscribes it again on every reconnect until UNSUBSCRIBE
	barrier   uint64        // the PING that confirms it
	ready     chan struct{} // closed once confirmed
	isReady   bool
	idleSince time.Time // when the last watcher left
}

// watcher is one waiting request.
type watcher struct {
	c     *channel
	elem  *list.Element
	wake  chan struct{} // capacity 1
	woken bool          // guarded by notifier.mu: a wake-up not yet acknowledged
}

const pingPrefix = "redislimit:"

func newNotifier(l *Limiter) *notifier {
	return &notifier{
		l: l,
		// No channels yet: no I/O until the first waiter.
		ps:      l.client.Subscribe(l.ctx),
		kick:    make(chan struct{}, 1),
		started: make(chan struct{}),
		linger:  max(10*l.cfg.RecheckEvery, l.cfg.LeaseTTL),
		chans:   make(map[string]*channel),
	}
}

func (n *notifier) close() { _ = n.ps.Close() }

func (n *notifier) kickControl() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// watch registers a waiter on a channel, subscribing to it if needed.
func (n *notifier) watch(name string) *watcher {
	n.mu.Lock()
	c := n.chans[name]
	if c == nil {
		c = &channel{name: name, ready: make(chan struct{})}
		n.chans[name] = c
	}
	w := &watcher{c: c, wake: make(chan struct{}, 1)}
	w.elem = c.watchers.PushBack(w)
	subscribe := !c.sent
	n.mu.Unlock()
	if subscribe {
		n.kickControl()
	}
	return w
}

// unwatch removes a waiter. A wake-up it received but did not use goes to
// the next waiter, so that a freed slot is not left unclaimed.
func (n *notifier) unwatch(w *watcher) {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := w.c
	c.watchers.Remove(w.elem)
	if w.woken {
		w.woken = false
		n.wakeLocked(c, 1)
	}
	if c.watchers.Len() == 0 {
		c.idleSince = time.Now()
		if !c.tracked {
			delete(n.chans, c.name)
		}
	}
}

// readyChan returns nil when w's subscription is confirmed, else a channel
// closed when it is.
func (n *notifier) readyChan(w *watcher) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if w.c.isReady {
		return nil
	}
	return w.c.ready
}

// ack acknowledges a wake-up received from w.wake.
func (n *notifier) ack(w *watcher) {
	n.mu.Lock()
	w.woken = false
	n.mu.Unlock()
	n.l.c.wakeups.Add(1)
}

// wakeLocked wakes up to k of c's waiters that have no wake-up pending,
// oldest first.
func (n *notifier) wakeLocked(c *channel, k int) {
	for e := c.watchers.Front(); e != nil && k > 0; e = e.Next() {
		w := e.Value.(*watcher)
		if !w.woken {
			w.woken = true
			w.wake <- struct{}{} // never blocks: woken was false, so it is empty
			k--
		}
	}
}

// receive reads the subscription connection until Close.
func (n *notifier) receive() {
	defer n.l.wg.Done()
	select {
	case <-n.started:
	case <-n.l.done:
		return
	}
	broken := false
	for {
		msg, err := n.ps.Receive(n.l.ctx)
		if n.l.ctx.Err() != nil {
			return
		}
		if err != nil {
			if !broken {
				broken = true
				n.connectionLost()
			}
			// go-redis reconnects (and resubscribes) on the next call.
			t := time.NewTimer(min(n.l.cfg.RecheckEvery, 250*time.Millisecond))
			select {
			case <-n.l.done:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		broken = false
		switch m := msg.(type) {
		case *redis.Message:
			k, err := strconv.Atoi(m.Payload)
			if err != nil || k < 1 {
				k = 1
			}
			n.mu.Lock()
			if c := n.chans[m.Channel]; c != nil {
				n.wakeLocked(c, k)
			}
			n.mu.Unlock()
		case *redis.Pong:
			if seq, ok := strings.CutPrefix(m.Payload, pingPrefix); ok {
				if s, err := strconv.ParseUint(seq, 10, 64); err == nil {
					n.confirm(s)
				}
			}
		}
	}
}

// confirm marks ready the channels whose SUBSCRIBE went before barrier PING s.
// It looks at every channel under the lock: there is one per tenant with
// waiters in this process (or that had some in the last linger), a number
// bounded by the Gates' capacity.
func (n *notifier) confirm(s uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.chans {
		if c.sent && !c.isReady && c.barrier <= s {
			c.isReady = true
			close(c.ready)
		}
	}
}

// connectionLost forgets every confirmation (notifications may have been
// missed and the subscriptions must be confirmed again) and wakes every
// waiter to re-check now. The channels stay tracked: go-redis subscribes
// them again when it reconnects, so an idle one still needs its UNSUBSCRIBE.
func (n *notifier) connectionLost() {
	n.mu.Lock()
	for _, c := range n.chans {
		c.sent = false
		if c.isReady {
			c.isReady = false
			c.ready = make(chan struct{})
		}
		for e := c.watchers.Front(); e != nil; e = e.Next() {
			if w := e.Value.(*watcher); !w.woken {
				w.woken = true
				w.wake <- struct{}{}
			}
		}
	}
	n.mu.Unlock()
	n.kickControl()
}

// control subscribes and unsubscribes as the waiters come and go.
func (n *notifier) control() {
	defer n.l.wg.Done()
	sweep := time.NewTicker(n.linger)
	defer sweep.Stop()
	var retry *time.Timer
	for {
		var retryC <-chan time.Time
		if retry != nil {
			retryC = retry.C
		}
		select {
		case <-n.l.done:
			if retry != nil {
				retry.Stop()
			}
			return
		case <-n.kick:
		case <-sweep.C:
		case <-retryC:
		}
		if retry != nil {
			retry.Stop()
			retry = nil
		}
		if !n.sync() {
			retry = time.NewTimer(n.l.cfg.RecheckEvery)
		}
	}
}

// sync sends the SUBSCRIBEs and UNSUBSCRIBEs the current waiters call for.
// It reports false when they could not be sent, to be tried again.
func (n *notifier) sync() bool {
	now := time.Now()
	var subs, unsubs []string
	n.mu.Lock()
	for name, c := range n.chans {
		switch {
		case c.watchers.Len() > 0 && !c.sent:
			c.sent, c.tracked = true, true
			subs = append(subs, name)
		case c.watchers.Len() == 0 && (!c.tracked || now.Sub(c.idleSince) >= n.linger):
			// go-redis forgets a channel on Unsubscribe even when the
			// command fails, so one attempt is enough.
			if c.tracked {
				unsubs = append(unsubs, name)
			}
			delete(n.chans, name)
		}
	}
	var seq uint64
	if len(subs) > 0 {
		n.seq++
		seq = n.seq
		for _, name := range subs {
			n.chans[name].barrier = seq
		}
	}
	n.mu.Unlock()
	if len(subs) == 0 && len(unsubs) == 0 {
		return true
	}

	ctx, cancel := context.WithTimeout(n.l.ctx, n.l.cfg.OpTimeout)
	defer cancel()
	var err error
	if len(unsubs) > 0 {
		err = n.ps.Unsubscribe(ctx, unsubs...)
		n.l.c.roundTrips.Add(1)
	}
	if len(subs) > 0 && err == nil {
		n.startOnce.Do(func() { close(n.started) })
		err = n.ps.Subscribe(ctx, subs...)
		if err == nil {
			err = n.ps.Ping(ctx, pingPrefix+strconv.FormatUint(seq, 10))
		}
		n.l.c.roundTrips.Add(1)
	}
	if err == nil {
		return true
	}
	n.mu.Lock()
	for _, name := range subs {
		if c := n.chans[name]; c != nil && c.barrier == seq {
			c.sent = false
		}
	}
	n.mu.Unlock()
	return false
}
