package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redlimit/redlimit"
)

// demo runs N simulated instances of a service, each with its own
// redlimit.Client, connection and client ID, sharing one limit through Redis;
// changes the rate from one of them halfway; then shows what each got and
// checks, window by window, that the shared limit held.
func demo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("demo", "demo [flags]", `Runs simulated service instances, each with its own redlimit.Client, connection
and client ID, sending bursty traffic to one shared limit. Halfway, one of them
changes the rate (SetRate) and the others follow. Then it shows what each got,
per instance and per second, and checks every second's grants against the
limit in force; it exits 1 if the limit did not hold. With -and, the limit
has a further rate (Config.And), which the SetRate keeps, checked in its own
windows too:

	redlimit demo -and 40/4s -duration 8s
`, stderr)
	var be backend
	be.addFlags(fs)
	var s demoSettings
	fs.IntVar(&s.instances, "instances", 4, "simulated service instances")
	fs.DurationVar(&s.duration, "duration", 4*time.Second, "how long to send traffic")
	fs.StringVar(&s.algorithm, "algorithm", "tokenbucket", "the limiter: "+strings.Join(algorithmNames(), ", "))
	fs.Int64Var(&s.rate, "rate", 20, "permits per second, shared by all instances")
	fs.Int64Var(&s.newRate, "new-rate", 10, "the rate one instance sets halfway through")
	var and moreRates
	fs.Var(&and, "and", "a further rate, N/PERIOD such as 40/4s (PERIOD whole seconds, at least 2s); repeat for more")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	switch {
	case fs.NArg() > 0:
		return usageError(fs, "unexpected argument %q", fs.Arg(0))
	case s.instances < 1 || s.instances > 64:
		return invalid(fs, "-instances %d: want 1 to 64", s.instances)
	case s.duration < 200*time.Millisecond || s.duration > 10*time.Minute:
		return invalid(fs, "-duration %v: want 200ms to 10m", s.duration)
	case !slices.Contains(algorithmNames(), s.algorithm):
		return invalid(fs, "unknown algorithm %q: want one of %s", s.algorithm, strings.Join(algorithmNames(), ", "))
	case s.rate < 1 || s.rate > 100_000 || s.newRate < 1 || s.newRate > 100_000:
		return invalid(fs, "-rate %d, -new-rate %d: want 1 to 100000", s.rate, s.newRate)
	}
	s.more = and.rates
	for _, more := range s.more {
		// The further rates are checked in windows made of whole seconds
		// of the per-second table.
		if more.Interval%time.Second != 0 || more.Interval < 2*time.Second {
			return invalid(fs, "-and %v: want a PERIOD of whole seconds, at least 2s", more)
		}
	}
	validate := algorithms[slices.Index(algorithmNames(), s.algorithm)].limiter(redlimit.New(nil), "demo").Validate
	for _, cfg := range []redlimit.Config{s.config(s.rate), s.config(s.newRate)} {
		if err := validate(cfg); err != nil {
			return invalid(fs, "%v", err)
		}
	}

	if code, ok := be.start(ctx, fs); !ok {
		return code
	}
	defer be.close()
	limit, kept := fmt.Sprintf("%d per second", s.rate), ""
	for _, more := range s.more {
		limit += fmt.Sprintf(" and %d per %v", more.Rate, more.Interval)
		kept = " (keeping the further rates)"
	}
	fmt.Fprintf(stdout, "%d instances share one %s limit of %s on %v, for %v.\n",
		s.instances, s.algorithm, limit, &be, s.duration)
	fmt.Fprintf(stdout, "Halfway, instance-1 sets it to %d per second%s; the others are not told.\n\n", s.newRate, kept)

	r, err := runDemo(ctx, &be, s, newProgress(stdout, s.duration))
	if err != nil {
		fmt.Fprintf(stderr, "redlimit demo: %v\n", err)
		return exitFail
	}
	if !r.report(stdout) {
		return exitFail
	}
	return exitOK
}

type demoSettings struct {
	instances     int
	duration      time.Duration
	algorithm     string
	rate, newRate int64
	more          []redlimit.Config // further rates (-and), which SetRate keeps
}

// config is the demo's limit with perSecond as its first rate.
func (s demoSettings) config(perSecond int64) redlimit.Config {
	return redlimit.PerSecond(perSecond).And(s.more...)
}

func algorithmNames() []string {
	names := make([]string, len(algorithms))
	for i, a := range algorithms {
		names[i] = a.name
	}
	return names
}

// tally counts one instance's decisions, or all of them, in one window of
// the limit.
type tally struct {
	granted, denied int
	// Every Limit Redis reported in the window, with the first instant it
	// did: the window of a change shows the old limit, then the new.
	limits map[int64]time.Time
}

func (t *tally) add(at time.Time, r redlimit.Result) {
	if r.Allowed {
		t.granted++
	} else {
		t.denied++
	}
	t.saw(r.Limit, at)
}

// saw records that the limit was in force at an instant.
func (t *tally) saw(limit int64, at time.Time) {
	if t.limits == nil {
		t.limits = map[int64]time.Time{}
	}
	if first, ok := t.limits[limit]; !ok || at.Before(first) {
		t.limits[limit] = at
	}
}

// inOrder returns the limits in the order they came into force, so that a
// change from 20 to 10 reads 20→10 whichever instance saw which.
func (t *tally) inOrder() []int64 {
	limits := slices.Collect(maps.Keys(t.limits))
	slices.SortFunc(limits, func(a, b int64) int { return t.limits[a].Compare(t.limits[b]) })
	return limits
}

// instanceResult is what one instance saw.
type instanceResult struct {
	id              string
	granted, denied int
	windows         map[int64]*tally // by window: Unix seconds
	followed        time.Duration    // from the rate change to its first decision under the new rate; -1 never
	lateOld         int              // decisions after the change still reporting the old rate
	err             error
}

type demoResult struct {
	settings  demoSettings
	changedAt time.Time // the instant instance-1's SetRate decided on
	instances []instanceResult
}

// runDemo runs the instances and waits for them.
//
// The instances decide on their own clock (WithClock(time.Now)) rather than
// on Redis TIME only so that the demo knows the instant of every decision, and
// so the window it fell in, to check the limit exactly. They share this
// machine's clock, as WithClock requires, and take turns (inOrder) so that
// decisions reach Redis in the order of their instants, as they would on
// Redis TIME. Without that, a decision stamped 0.999s could reach Redis after
// one stamped 1.000s; Redis counts it in the newer window (windows never go
// back), and the demo would count it in the older one.
func runDemo(ctx context.Context, be *backend, s demoSettings, p *progress) (demoResult, error) {
	// The traffic stops at the deadline, but a decision under way is let
	// finish and counted: dropping a grant would weaken the check.
	traffic, stop := context.WithTimeout(ctx, s.duration)
	defer stop()
	name := uniqueName("redlimit-demo:")
	cfg := s.config(s.rate)
	alg := algorithms[slices.Index(algorithmNames(), s.algorithm)]
	result := demoResult{settings: s, instances: make([]instanceResult, s.instances)}
	var changedAt atomic.Pointer[time.Time] // when instance-1's SetRate decided
	var inOrder sync.Mutex

	var wg sync.WaitGroup
	for i := range s.instances {
		rdb := be.newClient()
		defer rdb.Close()
		var last time.Time // the instant of this instance's latest decision; only its goroutine uses it
		client := redlimit.New(rdb,
			redlimit.WithClock(func() time.Time { last = time.Now(); return last }),
			redlimit.WithClientID(fmt.Sprintf("instance-%d", i+1)))
		limiter := alg.limiter(client, name).WithDefault(cfg)
		res := &result.instances[i]
		*res = instanceResult{id: client.ClientID(), windows: map[int64]*tally{}, followed: -1}
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			rng := rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))
			for traffic.Err() == nil {
				if i == 0 && changedAt.Load() == nil && time.Since(start) >= s.duration/2 {
					inOrder.Lock()
					err := limiter.SetRate(ctx, s.config(s.newRate))
					inOrder.Unlock()
					if err != nil {
						res.err = fmt.Errorf("SetRate: %w", err)
						return
					}
					at := last // last moves on with the next decision
					changedAt.Store(&at)
					p.changed(last, s.newRate)
				}
				// A burst of requests as fast as they come, then a pause.
				for n := 1 + rng.IntN(12); n > 0 && traffic.Err() == nil; n-- {
					inOrder.Lock()
					r, err := limiter.Allow(ctx, 1)
					inOrder.Unlock()
					if err != nil {
						res.err = err
						return
					}
					res.record(last, r, changedAt.Load(), s.rate, s.newRate)
					p.count(r.Allowed)
				}
				select {
				case <-traffic.Done():
				case <-time.After(time.Duration(10+rng.IntN(140)) * time.Millisecond):
				}
			}
		}()
	}
	wg.Wait()
	p.done()

	if at := changedAt.Load(); at != nil {
		result.changedAt = *at
	}
	rdb := be.newClient()
	defer rdb.Close()
	if _, err := alg.limiter(redlimit.New(rdb), name).Delete(context.Background()); err != nil {
		return result, fmt.Errorf("deleting the demo's limiter: %w", err)
	}
	for _, r := range result.instances {
		if r.err != nil {
			return result, fmt.Errorf("%s: %w", r.id, r.err)
		}
	}
	return result, nil
}

// record counts one decision. Decisions reach Redis in the order of their
// instants, so one after the change must report the new rate.
func (r *instanceResult) record(at time.Time, res redlimit.Result, changedAt *time.Time, oldRate, newRate int64) {
	if len(res.Quotas) > 0 {
		// Limit is the bound rate's; the per-second table checks the
		// first rate's, and each further rate has a table of its own.
		res.Limit = res.Quotas[0].Limit
	}
	if res.Allowed {
		r.granted++
	} else {
		r.denied++
	}
	window := at.Unix() // windows of one second, aligned to the epoch as fixed windows are
	if r.windows[window] == nil {
		r.windows[window] = &tally{}
	}
	r.windows[window].add(at, res)
	if changedAt != nil && at.After(*changedAt) {
		switch {
		case res.Limit == newRate && r.followed < 0:
			r.followed = at.Sub(*changedAt)
		case res.Limit == oldRate && oldRate != newRate:
			r.lateOld++
		}
	}
}

// report prints the tables and the verdict, and reports whether all held.
func (d demoResult) report(w io.Writer) bool {
	s := d.settings
	ok := true
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "Per instance:")
	fmt.Fprintln(tw, "instance\tgranted\tdenied\tfirst decided under the new rate")
	for i, r := range d.instances {
		followed := "set it"
		switch {
		case i == 0:
		case r.followed < 0:
			followed = "no decision after the change"
		default:
			followed = fmt.Sprintf("%v after the change", r.followed.Round(time.Microsecond))
		}
		if r.lateOld > 0 {
			followed += fmt.Sprintf("; then %d decisions still under the old rate", r.lateOld)
			ok = false
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", r.id, r.granted, r.denied, followed)
	}
	tw.Flush()

	// Merge the instances' windows, then check each against the limit Redis
	// reported in it: either rate, or both in the window of the change, where
	// the higher one applies (usage so far counts against the new rate).
	windows := map[int64]*tally{}
	for _, r := range d.instances {
		for at, t := range r.windows {
			if windows[at] == nil {
				windows[at] = &tally{}
			}
			windows[at].granted += t.granted
			windows[at].denied += t.denied
			for l, first := range t.limits {
				windows[at].saw(l, first)
			}
		}
	}
	showInstances := len(d.instances) <= 8
	fmt.Fprintf(tw, "\nPer second (the limit's windows; the first and last are partial):\n")
	header := "second\tlimit\tat most\tgranted\tdenied"
	if showInstances {
		for _, r := range d.instances {
			header += "\t" + r.id
		}
	}
	fmt.Fprintln(tw, header+"\theld")
	exceeded := 0
	for _, at := range slices.Sorted(maps.Keys(windows)) {
		t := windows[at]
		limits := t.inOrder()
		bound := slices.Max(limits)
		if s.algorithm == "funnel" {
			bound = 2 * bound // a full funnel (Burst = Rate) plus what drains in a second
		}
		held := "yes"
		if int64(t.granted) > bound {
			held = "NO"
			exceeded++
		}
		inForce := make([]string, len(limits))
		for i, l := range limits {
			if l != s.rate && l != s.newRate {
				held += fmt.Sprintf(" (Redis reported a limit of %d)", l)
				exceeded++
			}
			inForce[i] = strconv.FormatInt(l, 10)
		}
		row := fmt.Sprintf("%s\t%s\t%d\t%d\t%d", time.Unix(at, 0).Format("15:04:05"), strings.Join(inForce, "→"), bound, t.granted, t.denied)
		if showInstances {
			for _, r := range d.instances {
				n := 0
				if rt := r.windows[at]; rt != nil {
					n = rt.granted
				}
				row += fmt.Sprintf("\t%d", n)
			}
		}
		if !d.changedAt.IsZero() && d.changedAt.Unix() == at {
			held += "   ← SetRate"
		}
		fmt.Fprintln(tw, row+"\t"+held)
	}
	tw.Flush()
	if s.algorithm == "funnel" {
		fmt.Fprintln(w, "(A funnel takes a burst of Rate, then drains Rate per second: at most twice the rate in one second.)")
	}
	checked := len(windows)
	for _, more := range s.more {
		// Windows of the rate's interval, aligned to the epoch as fixed
		// windows are, summed from the per-second ones.
		per := int64(more.Interval / time.Second)
		granted := map[int64]int{}
		for at, t := range windows {
			granted[at-at%per] += t.granted
		}
		bound := more.Rate
		if s.algorithm == "funnel" {
			bound = 2 * more.Rate // a full funnel plus what drains in one interval
		}
		fmt.Fprintf(tw, "\nPer %v (the %d per %v rate's windows; the first and last are partial):\n", more.Interval, more.Rate, more.Interval)
		fmt.Fprintln(tw, "from\tat most\tgranted\theld")
		for _, at := range slices.Sorted(maps.Keys(granted)) {
			held := "yes"
			if int64(granted[at]) > bound {
				held = "NO"
				exceeded++
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", time.Unix(at, 0).Format("15:04:05"), bound, granted[at], held)
		}
		tw.Flush()
		checked += len(granted)
	}

	silent := 0 // instances with no decision after the change: their following is unchecked
	for _, r := range d.instances[1:] {
		if r.followed < 0 {
			silent++
		}
	}

	fmt.Fprintln(w)
	switch {
	case exceeded > 0:
		fmt.Fprintf(w, "FAILED: the shared limit did not hold in %d of %d windows.\n", exceeded, checked)
		ok = false
	case !ok:
		fmt.Fprintln(w, "FAILED: an instance kept deciding under the old rate after the change.")
	case len(windows) == 0 || d.changedAt.IsZero():
		fmt.Fprintln(w, "FAILED: too little traffic to check: no window, or no rate change. Try a longer -duration.")
		ok = false
	case silent > 0:
		// A starved instance (a loaded machine, a short run) leaves nothing to check
		// of its own following; the shared limit was still checked in every window.
		fmt.Fprintf(w, "The shared limit held: in each of the %d windows, the instances together got no more than the limit in force.\n", checked)
		fmt.Fprintf(w, "%d instance(s) made no decision after the change, so their following it is unchecked. Try a longer -duration.\n", silent)
	default:
		fmt.Fprintf(w, "The shared limit held: in each of the %d windows, the instances together got no more than the limit in force,\n", checked)
		fmt.Fprintln(w, "and every instance followed the new rate as soon as it was set.")
	}
	return ok
}

// progress shows the run as it goes: redrawn in place on a terminal, a line
// a second otherwise.
type progress struct {
	w               io.Writer
	terminal        bool
	length          time.Duration
	start           time.Time
	granted, denied atomic.Int64
	mu              sync.Mutex // serialises writes to w
	stop, stopped   chan struct{}
}

func newProgress(w io.Writer, length time.Duration) *progress {
	p := &progress{w: w, terminal: isTerminal(w), length: length, start: time.Now(),
		stop: make(chan struct{}), stopped: make(chan struct{})}
	every := time.Second
	if p.terminal {
		every = 100 * time.Millisecond
	}
	go func() {
		defer close(p.stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.draw(false)
			}
		}
	}()
	return p
}

func (p *progress) count(allowed bool) {
	if allowed {
		p.granted.Add(1)
	} else {
		p.denied.Add(1)
	}
}

// draw shows the counts so far; final draws the finished run.
func (p *progress) draw(final bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	elapsed := min(time.Since(p.start), p.length)
	if final {
		elapsed = p.length
	}
	line := fmt.Sprintf("%5.1fs / %v  granted %d  denied %d", elapsed.Seconds(), p.length, p.granted.Load(), p.denied.Load())
	if p.terminal {
		const width = 30
		done := int(width * elapsed / p.length)
		fmt.Fprintf(p.w, "\r  [%s%s]  %s", strings.Repeat("=", done), strings.Repeat(" ", width-done), line)
		return
	}
	if final || elapsed < p.length { // the last line is the final one
		fmt.Fprintln(p.w, "  "+line)
	}
}

func (p *progress) changed(at time.Time, rate int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.terminal {
		fmt.Fprint(p.w, "\r\033[K") // clear the progress line, redrawn on the next tick
	}
	fmt.Fprintf(p.w, "  %s  instance-1: SetRate(%d per second)\n", at.Format("15:04:05.000"), rate)
}

func (p *progress) done() {
	close(p.stop)
	<-p.stopped
	p.draw(true)
	if p.terminal {
		fmt.Fprintln(p.w)
	}
	fmt.Fprintln(p.w)
}
