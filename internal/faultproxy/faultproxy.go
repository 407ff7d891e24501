// Package faultproxy is a TCP proxy on 127.0.0.1 that breaks the traffic
// between a client and a server the way networks and servers do: it adds
// latency, holds a reply, closes a connection after the request went through
// and before the reply came back, or forwards half a reply and closes.
//
// It is written for request/reply protocols such as RESP, where a client
// writes a request in one write and waits for its reply: each chunk read from
// the server is taken as the reply to the last request read from the client.
// Faults are chosen by count (every Nth reply to a matching request), not by
// chance, so that a test can say exactly what it broke.
package faultproxy

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Kind is what the proxy does to a reply it picks.
type Kind int

const (
	// None forwards every reply.
	None Kind = iota
	// Hold forwards the reply after Faults.Hold: a stall long enough to
	// outlast the client's read timeout.
	Hold
	// Drop closes the connection instead of forwarding the reply: the
	// server received the request and answered, the client never hears.
	Drop
	// Truncate forwards the first half of the reply (rounded down: none of
	// a one-byte reply) and closes the connection.
	Truncate
)

// Faults is what the proxy does to the traffic; the zero value forwards it
// untouched.
type Faults struct {
	// Latency delays every chunk forwarded, both ways.
	Latency time.Duration
	// Kind is done to every Every-th reply to a request containing Match
	// (every request when Match is empty), counted over all connections.
	// Every 0 picks none.
	Kind  Kind
	Every int
	Match []byte
	// Hold is how long Hold holds a reply.
	Hold time.Duration
}

// Proxy forwards connections from its address to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	faults Faults
	conns  map[net.Conn]struct{} // both ends of every open pair
	closed bool
	wg     sync.WaitGroup

	replies  atomic.Int64 // replies to matching requests, the count Every applies to
	injected atomic.Int64
}

// Start listens on a free port of 127.0.0.1 and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Set replaces the faults; connections already open follow them from their
// next chunk, and the count Every applies to starts again.
func (p *Proxy) Set(f Faults) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = f
	p.replies.Store(0)
}

// Injected is how many replies Kind was done to so far.
func (p *Proxy) Injected() int64 { return p.injected.Load() }

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) current() Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults
}

// track registers c to be closed by Close; false if the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// serve forwards one connection until either side closes or a fault does.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close() // the client sees what it would have seen, a closed connection
		return
	}
	if !p.track(client) || !p.track(server) {
		client.Close()
		server.Close()
		return
	}
	// Closing both ends stops both pumps, whichever side ended first.
	var once sync.Once
	cut := func() {
		once.Do(func() {
			client.Close()
			server.Close()
			p.untrack(client)
			p.untrack(server)
		})
	}
	var asked atomic.Bool // the last request matched Faults.Match
	var pumps sync.WaitGroup
	pumps.Go(func() {
		defer cut()
		p.pump(client, server, func(chunk []byte) []byte {
			f := p.current()
			asked.Store(len(f.Match) == 0 || bytes.Contains(chunk, f.Match))
			return chunk
		})
	})
	pumps.Go(func() {
		defer cut()
		p.pump(server, client, func(chunk []byte) []byte {
			f := p.current()
			if !asked.Swap(false) || f.Kind == None || f.Every <= 0 || p.replies.Add(1)%int64(f.Every) != 0 {
				return chunk
			}
			p.injected.Add(1)
			switch f.Kind {
			case Hold:
				time.Sleep(f.Hold)
				return chunk
			case Drop:
				return nil
			default: // Truncate
				return chunk[:len(chunk)/2]
			}
		})
	})
	pumps.Wait()
}

// pump copies from src to dst chunk by chunk, each through fault, which
// returns what to forward: the whole chunk to go on, less (nil, a prefix) to
// forward that and stop. It returns when either end fails or closes.
func (p *Proxy) pump(src, dst net.Conn, fault func(chunk []byte) []byte) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			out := fault(buf[:n])
			if d := p.current().Latency; d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(out); werr != nil || len(out) < n {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
