package main

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is the checker's own TCP proxy between a pool and PostgreSQL: it
// delays and stalls what it forwards, and now and then cuts a connection.
// A cut is a fault (the errors it causes are excused for a moment); a delay
// or a stall must only ever cost time, and a context that ends during one
// must get the context's error.
type proxy struct {
	ln     net.Listener
	target string      // guarded by mu
	on     atomic.Bool // faults only while a run that wants them goes on
	mu     sync.Mutex
	rnd    *rand.Rand
	onCut  func() // the run's fault accounting
	conns  map[net.Conn]net.Conn
	closed bool
	// resume, while a cut-off lasts, is closed when it ends: nothing is
	// forwarded or dialled until then (nil: none).
	resume chan struct{}
}

func startProxy(target string, seed uint64) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, rnd: rand.New(rand.NewPCG(seed, 99)), conns: map[net.Conn]net.Conn{}}
	go p.accept()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.waitOpen()
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		s, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns[c] = s
		p.mu.Unlock()
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *proxy) intn(n int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rnd.IntN(n)
}

// pipe forwards from a to b, with the faults drawn per chunk.
func (p *proxy) pipe(a, b net.Conn) {
	defer func() {
		a.Close()
		b.Close()
		p.mu.Lock()
		delete(p.conns, a)
		delete(p.conns, b)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := a.Read(buf)
		p.waitOpen()
		if n > 0 && p.on.Load() {
			switch x := p.intn(1000); {
			case x < 2: // cut
				p.mu.Lock()
				f := p.onCut
				p.mu.Unlock()
				if f != nil {
					f()
				}
				return
			case x < 12: // stall
				time.Sleep(time.Duration(200+p.intn(800)) * time.Millisecond)
			case x < 100: // delay
				time.Sleep(time.Duration(1+p.intn(10)) * time.Millisecond)
			}
		}
		if n > 0 {
			if _, werr := b.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed side: close both
		}
	}
}

// waitOpen waits while a cut-off lasts.
func (p *proxy) waitOpen() {
	p.mu.Lock()
	r := p.resume
	p.mu.Unlock()
	if r != nil {
		<-r
	}
}

// cutOff stops the proxy forwarding anything for d, as a paused or
// unreachable server would; with drop it also closes every connection, so
// that the client must dial again (and its dial hangs until d is over).
func (p *proxy) cutOff(d time.Duration, drop bool) {
	r := make(chan struct{})
	p.mu.Lock()
	p.resume = r
	if drop {
		for c, s := range p.conns {
			c.Close()
			s.Close()
		}
	}
	p.mu.Unlock()
	time.Sleep(d) // the cut-off's length
	p.mu.Lock()
	if p.resume == r { // close did not end it first
		p.resume = nil
		close(r)
	}
	p.mu.Unlock()
}

// setTarget points the proxy's new connections at target.
func (p *proxy) setTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// setRun points the proxy's faults at a run (nil: none).
func (p *proxy) setRun(onCut func()) {
	p.mu.Lock()
	p.onCut = onCut
	p.mu.Unlock()
	p.on.Store(onCut != nil)
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
	for c, s := range p.conns {
		c.Close()
		s.Close()
	}
	p.mu.Unlock()
}
