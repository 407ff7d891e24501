package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/wire"
)

// ls lists the limiters in Redis: those with a key at prefix{name}, a hash
// or a string, and those running on a default that only their state keys
// show. It SCANs (never KEYS, which blocks Redis for as long as it takes
// over every key), every primary of a Cluster, and prints each batch as it
// comes: memory stays one batch whatever the number of keys.
func ls(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := newAdmin("ls", "ls [flags] [PATTERN]", `Lists the limiters in Redis, one line each: name, algorithm and stored
config, or "none stored" for one running on its handles' default. PATTERN is
a Redis glob over limiter names (without the prefix), such as 'user:*'. It
reads with SCAN (on every primary of a Cluster), so Redis keeps serving
however many keys it holds; the order is SCAN's. With --json, one JSON object
per line.

A limiter with reservations open (Reserve; get lists them) has "; N
reserved" at the end of its line.

An in-flight limit's line gives its stored limit and TTL (or none stored),
and how many holds are live now ("10 in flight, TTL 30s; 3 held"): one
script call each (InFlight.Holders), which writes nothing.

A limiter appears here while it has a key: its own (prefix{name}: a hash
with a stored config or state, or a string with a flat state or a marker),
or, running on a default, its state's (a token bucket's :value string, a
PerClient limiter's :clients registry, an in-flight limit's :holders). One
running on a default with no usage now has no key at all: there is nothing
to list.

	redlimit ls --redis redis://localhost:6379 --prefix svc: 'user:*'
`, true, stdout, stderr)
	count := a.fs.Int64("count", 1000, "SCAN's COUNT: keys Redis looks at per call")
	scanOrder := a.fs.Bool("scan-order", false, "print each batch as SCAN returns it, unsorted: the first lines come at once however many keys there are")
	pos, code, ok := a.parse(args)
	if !ok {
		return code
	}
	switch {
	case len(pos) > 1:
		return usageError(a.fs, "want at most one PATTERN, got %d arguments", len(pos))
	case *count < 1 || *count > 100_000:
		return invalid(a.fs, "--count %d: want 1 to 100000", *count)
	}
	pattern := ""
	if len(pos) == 1 {
		pattern = pos[0]
	}
	if code := a.connect(ctx); code != exitOK {
		return code
	}
	defer a.close()
	now, err := usageTime(ctx, a.rdb) // the instant open reservations are counted at
	if err != nil {
		return a.fail(err)
	}
	out := &lsOutput{w: bufio.NewWriter(stdout), json: a.json, scanOrder: *scanOrder, now: now}
	defer out.discard()
	passes := lsPasses(a.prefix, pattern)
	scan := func(ctx context.Context, node redis.Cmdable) error {
		return a.scan(ctx, node, passes, *count, out)
	}
	if cluster, ok := a.rdb.(*redis.ClusterClient); ok {
		// Each primary holds its own slots' keys, so each is scanned; they
		// run concurrently and take turns on the output.
		err = cluster.ForEachMaster(ctx, func(ctx context.Context, primary *redis.Client) error {
			return scan(ctx, primary)
		})
	} else {
		err = scan(ctx, a.rdb)
	}
	if err == nil {
		err = out.finish()
	}
	if err != nil {
		return a.fail(err)
	}
	if out.unknown > 0 {
		fmt.Fprintf(stderr, "redlimit ls: %d more names have only a PerClient registry (no config stored, every client full again), which does not tell their algorithm\n", out.unknown)
	}
	return exitOK
}

// lsOutput is shared by the scans of a Cluster's primaries. It prints the
// limiters by name (byte order: the same whatever the nodes and their SCAN
// order), or with scanOrder as they come.
type lsOutput struct {
	mu        sync.Mutex
	w         *bufio.Writer
	json      bool
	scanOrder bool
	now       time.Time // Redis TIME, read once
	sorter    lineSorter
	// unknown counts the names seen with only a PerClient registry: no
	// config stored, no client's state left (every one full again), so
	// nothing tells the algorithm.
	unknown int
}

// lsLine is ls's JSON, one object per line.
type lsLine struct {
	Name      string      `json:"name"`
	Key       string      `json:"key"`
	Algorithm string      `json:"algorithm"`
	Config    *configJSON `json:"config"` // null: none stored, or an in-flight limit
	// InFlight is an in-flight limit's stored config; absent when none is
	// stored, and for a rate limiter.
	InFlight *inFlightJSON `json:"inflight,omitempty"`
	// Held is how many holds an in-flight limit has live; absent for a
	// rate limiter.
	Held *int `json:"held,omitempty"`
	// Corrupt says why a stored config could not be read; the limiter's
	// calls fail with ErrCorruptState.
	Corrupt string `json:"corrupt,omitempty"`
	// Shadow: the stored config is in shadow mode (redlimit shadow);
	// absent when it is not.
	Shadow bool `json:"shadow,omitempty"`
	// Reserved is how many entries of the limiter's request log are open:
	// reservations not yet released or settled (get lists them); absent
	// for none.
	Reserved int64 `json:"reserved,omitempty"`
}

// The keys ls reads: a limiter's own key (prefix{name}: its hash, or a
// string: a flat state or a marker), and, for a limiter running on a
// default that has no key of its own (state from before markers, or
// written by Redisson), the first state key of a token bucket (:value), a
// PerClient limiter's registry (:clients) and an in-flight limit's holds
// (:holders). One key each, so that a limiter is listed once without
// remembering which were.
type keyKind int

const (
	ownKey keyKind = 1 << iota
	valueKey
	clientsKey
	holdersKey
)

// stateKeys are the kinds of key found by their suffix, and the suffix.
var stateKeys = []struct {
	kind   keyKind
	suffix string
}{{valueKey, wire.TokenBucket.State[0]}, {clientsKey, wire.SuffixClients}, {holdersKey, wire.SuffixHolders}}

// lsPass is one SCAN over the keyspace: a MATCH and the kinds of key it is
// for. Without a PATTERN, prefix* (or *) covers every kind in one pass; a
// PATTERN needs one MATCH per kind, each exact.
type lsPass struct {
	match string
	kinds keyKind
}

func lsPasses(prefix, pattern string) []lsPass {
	own := matchPattern(prefix, pattern)
	if pattern == "" {
		return []lsPass{{own, ownKey | valueKey | clientsKey | holdersKey}}
	}
	passes := []lsPass{{own, ownKey}}
	for _, k := range stateKeys {
		passes = append(passes, lsPass{wire.KeyOf(own, k.suffix), k.kind})
	}
	return passes
}

// scan walks one node's keyspace, a SCAN call at a time, and prints the
// limiters among each call's keys before asking for more.
func (a *admin) scan(ctx context.Context, node redis.Cmdable, passes []lsPass, count int64, out *lsOutput) error {
	for _, p := range passes {
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, p.match, count).Result()
			if err != nil {
				return err
			}
			if err := a.describe(ctx, keys, p.kinds, out); err != nil {
				return err
			}
			if next == 0 {
				break
			}
			cursor = next
		}
	}
	return nil
}

// candidate is a key that may tell a limiter, and what ls reads of it.
type candidate struct {
	name, full string // the limiter's
	key        string
	kind       keyKind
	typ        *redis.StatusCmd // ownKey: TYPE
	exists     *redis.IntCmd    // valueKey, clientsKey: whether the limiter's own key exists
	first      *redis.StringSliceCmd
	fields     *redis.SliceCmd  // a hash's
	value      *redis.StringCmd // a string's
	state      []*redis.IntCmd  // a registry's first client: EXISTS of each algorithm's state keys (wire.Algorithms' order)
	reserved   *redis.IntCmd    // ZCOUNT of the request log's open entries
}

// describe reads the keys of one SCAN call that may tell a limiter, in two
// pipelines (what each key is, then what it holds), and prints the limiters.
func (a *admin) describe(ctx context.Context, keys []string, kinds keyKind, out *lsOutput) error {
	var batch []*candidate
	pipe := a.rdb.Pipeline()
	for _, key := range keys {
		c := a.candidate(key, kinds)
		if c == nil {
			continue
		}
		switch c.kind {
		case ownKey:
			c.typ = pipe.Type(ctx, key)
		case valueKey, holdersKey:
			c.exists = pipe.Exists(ctx, c.full)
		case clientsKey:
			c.exists = pipe.Exists(ctx, c.full)
			c.first = pipe.ZRange(ctx, key, -1, -1) // the latest to be granted
		}
		c.reserved = pipe.ZCount(ctx, wire.KeyOf(c.full, wire.SuffixRequests), openSince(out.now), "+inf")
		batch = append(batch, c)
	}
	if len(batch) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !isWrongType(err) {
		return err
	}
	for _, c := range batch {
		switch {
		case c.typ != nil && c.typ.Val() == "hash":
			c.fields = pipe.HMGet(ctx, c.key, ownKeyFields...)
		case c.typ != nil && c.typ.Val() == "string":
			c.value = pipe.Get(ctx, c.key)
		case c.first != nil && c.exists.Val() == 0 && len(c.first.Val()) == 1:
			for _, alg := range wire.Algorithms {
				c.state = append(c.state, pipe.Exists(ctx, alg.StateKeys(c.full, c.first.Val()[0])...))
			}
		}
	}
	if pipe.Len() > 0 {
		// Keys deleted or replaced since: redis.Nil, WRONGTYPE; skipped below.
		if _, err := pipe.Exec(ctx); err != nil && !isWrongType(err) && err != redis.Nil {
			return err
		}
	}
	lines := make([]lsLine, len(batch))
	for i, c := range batch {
		line, err := c.line()
		if err != nil {
			return err
		}
		if line.Algorithm == inFlightAlgorithm {
			if err := a.countHolds(ctx, &line); err != nil {
				return err
			}
		}
		lines[i] = line
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	for i, line := range lines {
		switch c := batch[i]; {
		case line.Algorithm != "":
			if err := out.add(line); err != nil {
				return err
			}
		case c.kind == clientsKey && c.exists.Val() == 0:
			out.unknown++
		}
	}
	if out.scanOrder {
		return out.w.Flush()
	}
	return nil
}

// countHolds sets an in-flight limit's Held, as the library counts its live
// holds. Holds it cannot read (a :holders key that is no sorted set) make
// the line corrupt, as a config it cannot read does.
func (a *admin) countHolds(ctx context.Context, line *lsLine) error {
	holders, err := a.client.InFlight(line.Name).Holders(ctx)
	switch {
	case errors.Is(err, redlimit.ErrCorruptState):
		line.Corrupt = strings.TrimPrefix(err.Error(), "redlimit: ")
		return nil
	case errors.Is(err, redlimit.ErrInvalidName):
		line.Algorithm = "" // keys no handle could have written: no limiter
		return nil
	case err != nil:
		return err
	}
	held := len(holders)
	line.Held = &held
	return nil
}

// candidate returns what to read of key, a key of one of kinds, or nil
// when key cannot tell a limiter.
func (a *admin) candidate(key string, kinds keyKind) *candidate {
	if kinds&ownKey != 0 {
		if name, ok := wire.NameOf(a.prefix, key); ok {
			return &candidate{name: name, full: key, key: key, kind: ownKey}
		}
	}
	for _, k := range stateKeys {
		if kinds&k.kind == 0 {
			continue
		}
		full, ok := wire.LimiterKey(key, k.suffix)
		if !ok {
			continue
		}
		if name, ok := wire.NameOf(a.prefix, full); ok {
			return &candidate{name: name, full: full, key: key, kind: k.kind}
		}
	}
	return nil
}

// line says what c found; no Algorithm when it is no limiter's, or one
// listed by its own key.
func (c *candidate) line() (lsLine, error) {
	line := lsLine{Name: c.name, Key: c.full, Reserved: c.reserved.Val()}
	switch {
	case c.value != nil:
		line.Algorithm = wire.OwnerOf(c.value.Val())
	case c.fields != nil:
		f, err := c.fields.Result()
		if isWrongType(err) || err == redis.Nil {
			return lsLine{}, nil // no longer a hash: deleted or replaced since
		}
		if err != nil {
			return lsLine{}, err
		}
		h := readFields(f)
		alg, stored := h.owner()
		line.Algorithm = alg
		switch {
		case alg == inFlightAlgorithm:
			cfg, err := storedInFlight(h, c.name)
			if err != nil {
				line.Corrupt = err.Error()
			} else {
				line.InFlight = cfg
			}
		case alg != "" && stored:
			line.Shadow = h.shadow()
			cfg, err := storedConfig(h)
			if err != nil {
				line.Corrupt = err.Error()
			} else {
				line.Config = toJSON(cfg)
			}
		}
	case c.kind == valueKey && c.exists.Val() == 0:
		line.Algorithm = wire.TokenBucket.Name // Overall, on a default
	case c.kind == holdersKey && c.exists.Val() == 0:
		line.Algorithm = inFlightAlgorithm // on a default
	case c.state != nil:
		for i, n := range c.state {
			if n.Val() > 0 {
				line.Algorithm = wire.Algorithms[i].Name
				break
			}
		}
	}
	return line, nil
}

// add prints l, or keeps it for finish to print in order.
func (o *lsOutput) add(l lsLine) error {
	if o.scanOrder {
		_, err := o.w.WriteString(o.format(l))
		return err
	}
	return o.sorter.add(l.Name, o.format(l))
}

// finish prints the lines kept, by name.
func (o *lsOutput) finish() error {
	if o.scanOrder {
		return o.w.Flush()
	}
	return o.sorter.write(o.w)
}

// discard removes what the sorter spilled, printed or not.
func (o *lsOutput) discard() { o.sorter.close() }

// format is l's line, with its newline.
func (o *lsOutput) format(l lsLine) string {
	if o.json {
		b, _ := json.Marshal(l) // plain strings and integers: cannot fail
		return string(b) + "\n"
	}
	about := "none stored (runs on its handles' default)"
	switch {
	case l.Corrupt != "":
		about = "corrupt: " + l.Corrupt
	case l.Config != nil:
		about = fromJSON(l.Config).String()
	case l.InFlight != nil:
		about = l.InFlight.String()
	}
	if l.Held != nil {
		about += fmt.Sprintf("; %d held", *l.Held)
	}
	if l.Shadow {
		about += "; shadow mode"
	}
	if l.Reserved > 0 {
		about += fmt.Sprintf("; %d reserved", l.Reserved)
	}
	// Fixed widths, not a tabwriter: with --scan-order that would hold
	// every line until the end.
	return fmt.Sprintf("%-24s  %-14s  %s\n", l.Name, l.Algorithm, about)
}

// storedConfig reads a stored config from its hash's fields, as
// internal/wire reads them (the scripts check them the same way before
// every decision).
func storedConfig(h hashFields) (redlimit.Config, error) {
	st, found, err := wire.ParseStoredFields(h)
	switch {
	case err != nil:
		// Said as the scripts say it, without the library's sentinel.
		return redlimit.Config{}, errors.New(strings.TrimPrefix(err.Error(), wire.ErrCorruptState.Error()+": "))
	case !found:
		return redlimit.Config{}, fmt.Errorf("field %s missing", wire.FieldRate)
	}
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
	cfg := redlimit.Config{Rate: st.Rate, Interval: ms(st.IntervalMS), Type: redlimit.RateType(st.Type),
		Burst: st.Burst, Buckets: int(st.Buckets), KeepAlive: ms(st.KeepAliveMS)}
	for _, r := range st.More {
		cfg.More = append(cfg.More, redlimit.Config{Rate: r.Rate, Interval: ms(r.IntervalMS), Burst: r.Burst, Buckets: int(r.Buckets)})
	}
	for _, pc := range st.Calendars {
		rate := &cfg
		if pc.Place > 1 {
			rate = &cfg.More[pc.Place-2]
		}
		if err := rate.Calendar.UnmarshalText([]byte(pc.Spec)); err != nil {
			return redlimit.Config{}, fmt.Errorf("field %s = %q", wire.FieldCalendar, h[wire.FieldCalendar])
		}
	}
	return cfg, nil
}

// matchPattern is SCAN's MATCH for limiter names matching pattern: named
// as the library names them (wire.FullName), prefix{pattern} under a
// prefix. A name that holds a tag of its own keeps it, so such names are
// found without a pattern, or with a pattern that has the tag.
func matchPattern(prefix, pattern string) string {
	if pattern == "" {
		return globEscape(prefix) + "*"
	}
	return wire.FullName(globEscape(prefix), pattern)
}

// globEscape makes s match itself in a Redis glob.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
