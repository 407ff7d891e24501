package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// gate is a handler that blocks until let through, so that requests stay
// in flight while a test looks.
type gate struct {
	entered chan *redlimit.Hold // each request's Hold, as it enters
	release chan struct{}       // one send lets one request finish
}

func newGate() *gate {
	return &gate{entered: make(chan *redlimit.Hold, 16), release: make(chan struct{})}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, _ := httplimit.HoldFromContext(r.Context())
	g.entered <- h
	<-g.release
	w.WriteHeader(http.StatusOK)
}

// serveAsync serves one request in the background and returns its status.
func serveAsync(h http.Handler, remote string) <-chan int {
	status := make(chan int, 1)
	go func() {
		r := httptest.NewRequest(http.MethodGet, "/export", nil)
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		status <- w.Code
	}()
	return status
}

func serveNow(t *testing.T, h http.Handler, remote string) int {
	t.Helper()
	select {
	case code := <-serveAsync(h, remote):
		return code
	case <-time.After(5 * time.Second):
		t.Fatal("the middleware did not answer")
		return 0
	}
}

func heldCount(t *testing.T, l *redlimit.InFlight) int {
	t.Helper()
	list, err := l.Holders(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

// Two instances of a service share one in-flight limit of 2 per client:
// a third request of the client is answered 429 at once while two are being
// served, another client is not; each slot comes back as its handler
// returns.
func TestInFlightMiddlewareSharesOneLimit(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		name := uniqueName(t)
		cfg := redlimit.InFlightConfig{Limit: 2, TTL: 30 * time.Second}
		g := newGate()
		var instances []http.Handler
		for range 2 {
			client := redlimit.New(newRDB())
			limit := httplimit.InFlight(func(key string) *redlimit.InFlight {
				return client.InFlight(name + key).WithDefault(cfg)
			})
			instances = append(instances, limit(g))
		}
		limitOf := redlimit.New(newRDB()).InFlight(name + "192.0.2.1")

		first := serveAsync(instances[0], "192.0.2.1:1000")
		second := serveAsync(instances[1], "192.0.2.1:1001")
		for range 2 {
			if h := <-g.entered; h == nil {
				t.Fatal("the handler has no Hold in its context")
			}
		}
		if n := heldCount(t, limitOf); n != 2 {
			t.Fatalf("%d held, want 2", n)
		}
		if code := serveNow(t, instances[0], "192.0.2.1:1002"); code != http.StatusTooManyRequests {
			t.Fatalf("third request: %d, want 429", code)
		}
		other := serveAsync(instances[1], "198.51.100.7:1000") // a client of its own
		<-g.entered

		for range 3 {
			g.release <- struct{}{}
		}
		for _, done := range []<-chan int{first, second, other} {
			if code := <-done; code != http.StatusOK {
				t.Fatalf("finished with %d, want 200", code)
			}
		}
		// ServeHTTP returns once the release is done.
		if n := heldCount(t, limitOf); n != 0 {
			t.Fatalf("%d still held after every handler returned", n)
		}
		fourth := serveAsync(instances[1], "192.0.2.1:1003")
		<-g.entered
		g.release <- struct{}{}
		if code := <-fourth; code != http.StatusOK {
			t.Fatalf("a slot came back: %d, want 200", code)
		}
	})
}

// WithMaxWait: a full limit waits for a slot: granted when one comes free
// in time, 429 when none does.
func TestInFlightMiddlewareMaxWait(t *testing.T) {
	client := redlimit.New(redistest.Miniredis(t))
	exports := client.InFlight(uniqueName(t)).WithDefault(redlimit.InFlightConfig{Limit: 1, TTL: 30 * time.Second})
	g := newGate()
	waiting := httplimit.InFlight(func(string) *redlimit.InFlight { return exports }, httplimit.WithMaxWait(5*time.Second))(g)
	brief := httplimit.InFlight(func(string) *redlimit.InFlight { return exports }, httplimit.WithMaxWait(60*time.Millisecond))(g)

	busy := serveAsync(waiting, "192.0.2.1:1")
	<-g.entered
	start := time.Now()
	if code := serveNow(t, brief, "192.0.2.1:2"); code != http.StatusTooManyRequests {
		t.Fatalf("no slot within the wait: %d, want 429", code)
	}
	if waited := time.Since(start); waited < 60*time.Millisecond {
		t.Fatalf("answered after %v, before the wait ended", waited)
	}
	patient := serveAsync(waiting, "192.0.2.1:3")
	time.Sleep(100 * time.Millisecond)
	g.release <- struct{}{} // busy returns: its slot goes to patient
	if code := <-busy; code != http.StatusOK {
		t.Fatalf("busy: %d", code)
	}
	<-g.entered
	g.release <- struct{}{}
	if code := <-patient; code != http.StatusOK {
		t.Fatalf("a slot came free within the wait: %d, want 200", code)
	}
}

// A handler that panics releases its slot all the same.
func TestInFlightMiddlewareReleasesOnPanic(t *testing.T) {
	client := redlimit.New(redistest.Miniredis(t))
	exports := client.InFlight(uniqueName(t)).WithDefault(redlimit.InFlightConfig{Limit: 1, TTL: 30 * time.Second})
	h := httplimit.InFlight(func(string) *redlimit.InFlight { return exports })(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("boom")
	}))
	func() {
		defer func() { _ = recover() }()
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	if n := heldCount(t, exports); n != 0 {
		t.Fatalf("%d held after the handler panicked", n)
	}
}

// Errors map as New's: a failed KeyFunc is 400; an unavailable Redis 503,
// or with WithFailOpen the handler runs (with no Hold), the error hook told either
// way; a nil limit is unlimited; a hold lost under the handler (the limit
// deleted meanwhile) is told to the error hook when it is released.
func TestInFlightMiddlewareErrors(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, held := httplimit.HoldFromContext(r.Context()); held {
			w.Header().Set("X-Held", "yes")
		}
		if d, decided := httplimit.FromContext(r.Context()); decided && d.Result.Allowed {
			w.Header().Set("X-Reason", d.Result.Reason.String())
		}
	})
	var mu sync.Mutex
	var hooked []error
	hook := httplimit.WithErrorHook(func(_ *http.Request, err error) {
		mu.Lock()
		defer mu.Unlock()
		hooked = append(hooked, err)
	})
	lastHooked := func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(hooked) == 0 {
			return nil
		}
		err := hooked[len(hooked)-1]
		hooked = nil
		return err
	}
	cfg := redlimit.InFlightConfig{Limit: 1, TTL: 30 * time.Second}
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { down.Close() })
	unavailable := redlimit.New(down).InFlight("x").WithDefault(cfg)
	serve := func(h http.Handler, remote string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	w := serve(httplimit.InFlight(func(string) *redlimit.InFlight { return unavailable }, hook)(ok), "192.0.2.1:1")
	if w.Code != http.StatusServiceUnavailable || !errors.Is(lastHooked(), redlimit.ErrUnavailable) {
		t.Fatalf("unavailable: %d", w.Code)
	}
	w = serve(httplimit.InFlight(func(string) *redlimit.InFlight { return unavailable }, hook, httplimit.WithFailOpen())(ok), "192.0.2.1:1")
	if w.Code != http.StatusOK || w.Header().Get("X-Held") != "" || w.Header().Get("X-Reason") != "fail-open" || !errors.Is(lastHooked(), redlimit.ErrUnavailable) {
		t.Fatalf("fail open: %d, held %q, reason %q", w.Code, w.Header().Get("X-Held"), w.Header().Get("X-Reason"))
	}
	w = serve(httplimit.InFlight(func(string) *redlimit.InFlight { return unavailable }, hook)(ok), "not an address")
	if w.Code != http.StatusBadRequest || !errors.Is(lastHooked(), httplimit.ErrNoKey) {
		t.Fatalf("no key: %d", w.Code)
	}
	w = serve(httplimit.InFlight(func(string) *redlimit.InFlight { return nil }, hook)(ok), "192.0.2.1:1")
	if w.Code != http.StatusOK || w.Header().Get("X-Held") != "" {
		t.Fatalf("unlimited: %d", w.Code)
	}

	client := redlimit.New(redistest.Miniredis(t))
	exports := client.InFlight(uniqueName(t)).WithDefault(cfg)
	deleting := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		if _, err := exports.Delete(context.Background()); err != nil {
			t.Error(err)
		}
	})
	w = serve(httplimit.InFlight(func(string) *redlimit.InFlight { return exports }, hook)(deleting), "192.0.2.1:1")
	if w.Code != http.StatusOK || !errors.Is(lastHooked(), redlimit.ErrHoldLost) {
		t.Fatalf("lost: %d", w.Code)
	}
}
