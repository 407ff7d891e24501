package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// echo is a server that answers each line "ping N\n" with "pong N, and a
// long tail\n" and keeps the requests it received, so a test can tell a
// request that reached it from one that did not.
type echo struct {
	ln       net.Listener
	mu       sync.Mutex
	received []string
}

func startEcho(t *testing.T) *echo {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					e.mu.Lock()
					e.received = append(e.received, line)
					e.mu.Unlock()
					if _, err := io.WriteString(c, "pong"+line[len("ping"):len(line)-1]+", and a long tail\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return e
}

func (e *echo) got() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.received...)
}

func startProxy(t *testing.T, target string, f Faults) *Proxy {
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	p.Set(f)
	t.Cleanup(func() { p.Close() })
	return p
}

// ask sends one request on conn and reads until the reply's newline or the
// connection ends: the reply (whole or not), how long it took, and the read's
// error.
func ask(t *testing.T, conn net.Conn, request string) (string, time.Duration, error) {
	t.Helper()
	began := time.Now()
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var reply []byte
	buf := make([]byte, 1)
	for {
		n, err := conn.Read(buf)
		reply = append(reply, buf[:n]...)
		if err != nil {
			return string(reply), time.Since(began), err
		}
		if buf[0] == '\n' {
			return string(reply), time.Since(began), nil
		}
	}
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

const whole = "pong 1, and a long tail\n"

func TestForwards(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String(), Faults{})
	c := dial(t, p)
	for _, n := range []string{"1", "2"} {
		reply, _, err := ask(t, c, "ping "+n+"\n")
		if err != nil || reply != "pong "+n+", and a long tail\n" {
			t.Fatalf("reply %q, %v", reply, err)
		}
	}
	if p.Injected() != 0 {
		t.Fatalf("injected %d, want 0", p.Injected())
	}
}

func TestLatency(t *testing.T) {
	e := startEcho(t)
	const latency = 50 * time.Millisecond
	p := startProxy(t, e.ln.Addr().String(), Faults{Latency: latency})
	reply, took, err := ask(t, dial(t, p), "ping 1\n")
	if err != nil || reply != whole {
		t.Fatalf("reply %q, %v", reply, err)
	}
	if took < 2*latency {
		t.Fatalf("round trip %v, want at least %v (latency both ways)", took, 2*latency)
	}
}

func TestHoldEveryOther(t *testing.T) {
	e := startEcho(t)
	const hold = 200 * time.Millisecond
	p := startProxy(t, e.ln.Addr().String(), Faults{Kind: Hold, Every: 2, Hold: hold})
	c := dial(t, p)
	for i, wantHeld := range []bool{false, true, false, true} {
		reply, took, err := ask(t, c, "ping 1\n")
		if err != nil || reply != whole {
			t.Fatalf("request %d: reply %q, %v", i+1, reply, err)
		}
		if held := took >= hold; held != wantHeld {
			t.Fatalf("request %d took %v: held %v, want %v", i+1, took, held, wantHeld)
		}
	}
	if p.Injected() != 2 {
		t.Fatalf("injected %d, want 2", p.Injected())
	}
}

// Drop: the server got the request, the client gets no byte of the reply and
// a closed connection.
func TestDropAfterRequest(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String(), Faults{Kind: Drop, Every: 1})
	reply, _, err := ask(t, dial(t, p), "ping 7\n")
	if !errors.Is(err, io.EOF) || reply != "" {
		t.Fatalf("reply %q, %v; want nothing and EOF", reply, err)
	}
	if got := e.got(); len(got) != 1 || got[0] != "ping 7\n" {
		t.Fatalf("the server received %q, want the request", got)
	}
	if p.Injected() != 1 {
		t.Fatalf("injected %d, want 1", p.Injected())
	}
}

func TestTruncate(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String(), Faults{Kind: Truncate, Every: 1})
	reply, _, err := ask(t, dial(t, p), "ping 1\n")
	if !errors.Is(err, io.EOF) || reply != whole[:len(whole)/2] {
		t.Fatalf("reply %q, %v; want %q and EOF", reply, err, whole[:len(whole)/2])
	}
}

// Every counts replies over all connections, and only replies to requests
// that contain Match.
func TestEveryAndMatch(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String(), Faults{Kind: Drop, Every: 2, Match: []byte("ping")})
	var dropped []int
	for i := range 6 {
		c := dial(t, p)
		// A request that does not match neither counts nor is dropped.
		if reply, _, err := ask(t, c, "other 1\n"); err != nil || reply == "" {
			t.Fatalf("an unmatched request: reply %q, %v", reply, err)
		}
		if _, _, err := ask(t, c, "ping 1\n"); err != nil {
			dropped = append(dropped, i+1)
		}
	}
	if len(dropped) != 3 || dropped[0] != 2 || dropped[1] != 4 || dropped[2] != 6 {
		t.Fatalf("dropped the replies to requests %v, want 2, 4 and 6", dropped)
	}
	p.Set(Faults{})
	if reply, _, err := ask(t, dial(t, p), "ping 1\n"); err != nil || reply != whole {
		t.Fatalf("faults cleared: reply %q, %v", reply, err)
	}
}

func TestCloseEndsConnections(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String(), Faults{})
	c := dial(t, p)
	if _, _, err := ask(t, c, "ping 1\n"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read after Close: %v, want EOF", err)
	}
	if _, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Fatal("the proxy still accepts after Close")
	}
}
