// Package inflight keeps what a client of in-flight limits holds in memory,
// beside the script that decides them (scripts/inflight.lua): the lines of
// Acquires waiting on each limit, the lease each hold keeps while its
// holder works, and the script's replies read. The package redlimit's
// InFlight and Hold are the API, and say what these promise.
package inflight

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Lines are the Acquires of one Client waiting on its in-flight limits: a
// line per limit name, first come first served. Only the first in a line
// asks Redis; the others wait their turn, so that a full limit costs Redis
// one call per poll per process, however many wait. The zero Lines is
// ready to use.
type Lines struct {
	mu    sync.Mutex
	lines map[string]*line
}

// line is the Acquires waiting on one limit, in the order they came.
type line struct {
	mu      sync.Mutex
	waiters []*Place
	users   int // Acquires holding the line, to drop it when none does
	// freed wakes the first waiter early: a hold of this Client was released.
	freed chan struct{}
}

// Place is one Acquire's place in its line.
type Place struct {
	lines   *Lines
	name    string
	line    *line
	ready   chan struct{} // closed when it is its turn: first in line, or the line scattered
	started bool          // ready is closed; under line.mu
}

// Join puts an Acquire at the end of name's line, made when the first
// comes. Its Ready is closed at once when it is first.
func (ls *Lines) Join(name string) *Place {
	ls.mu.Lock()
	q := ls.lines[name]
	if q == nil {
		if ls.lines == nil {
			ls.lines = map[string]*line{}
		}
		q = &line{freed: make(chan struct{}, 1)}
		ls.lines[name] = q
	}
	q.users++
	ls.mu.Unlock()
	p := &Place{lines: ls, name: name, line: q, ready: make(chan struct{})}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiters = append(q.waiters, p)
	if len(q.waiters) == 1 {
		p.start()
	}
	return p
}

// Ready is closed when it is p's turn to ask Redis.
func (p *Place) Ready() <-chan struct{} { return p.ready }

// start gives p its turn, once; its line's mu is held.
func (p *Place) start() {
	if !p.started {
		p.started = true
		close(p.ready)
	}
}

// Scatter gives every waiter in p's line its turn at once: Redis failing
// (or p's caller giving up) says nothing of the others, and a grant made
// without Redis (fail-open) will be made to them too, so each asks for
// itself now, as in a line of one, rather than wait its turn behind calls
// that may each time out.
func (p *Place) Scatter() {
	p.line.mu.Lock()
	defer p.line.mu.Unlock()
	for _, w := range p.line.waiters {
		w.start()
	}
}

// Leave takes p out of its line (first or not) and, if it was first, gives
// the next its turn; the line goes once no Acquire holds it.
func (p *Place) Leave() {
	q := p.line
	q.mu.Lock()
	if i := slices.Index(q.waiters, p); i >= 0 {
		q.waiters = slices.Delete(q.waiters, i, i+1)
		if i == 0 && len(q.waiters) > 0 {
			q.waiters[0].start()
		}
	}
	q.mu.Unlock()
	ls := p.lines
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if q.users--; q.users == 0 {
		delete(ls.lines, p.name)
	}
}

// Sleep waits d with sleep (the Client's, on its clock), or until a hold
// of this Client on the limit is released (Lines.Released), or ctx ends:
// then it returns ctx's error.
func (p *Place) Sleep(ctx context.Context, sleep func(context.Context, time.Duration) error, d time.Duration) error {
	woken, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-p.line.freed:
			stop()
		case <-done:
		}
	}()
	_ = sleep(woken, d)
	return ctx.Err()
}

// Released tells the first waiter on name, if any, that a slot came free.
func (ls *Lines) Released(name string) {
	ls.mu.Lock()
	q := ls.lines[name]
	ls.mu.Unlock()
	if q != nil {
		select {
		case q.freed <- struct{}{}:
		default: // told already
		}
	}
}

// Waiting is how many Acquires wait in name's line, the first included.
func (ls *Lines) Waiting(name string) int {
	ls.mu.Lock()
	q := ls.lines[name]
	ls.mu.Unlock()
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters)
}

// Len is how many lines are kept: one per limit an Acquire waits on.
func (ls *Lines) Len() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.lines)
}
