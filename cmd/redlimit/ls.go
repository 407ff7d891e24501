package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
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
	out := &lsOutput{w: bufio.NewWriter(stdout), json: a.json}
	passes := lsPasses(a.prefix, pattern)
	scan := func(ctx context.Context, node redis.Cmdable) error {
		return a.scan(ctx, node, passes, *count, out)
	}
	var err error
	if cluster, ok := a.rdb.(*redis.ClusterClient); ok {
		// Each primary holds its own slots' keys, so each is scanned; they
		// run concurrently and take turns on the output.
		err = cluster.ForEachMaster(ctx, func(ctx context.Context, primary *redis.Client) error {
			return scan(ctx, primary)
		})
	} else {
		err = scan(ctx, a.rdb)
	}
	if err != nil {
		return a.fail(err)
	}
	if out.unknown > 0 {
		fmt.Fprintf(stderr, "redlimit ls: %d more names have only a PerClient registry (no config stored, every client full again), which does not tell their algorithm\n", out.unknown)
	}
	return exitOK
}

// lsOutput is shared by the scans of a Cluster's primaries.
type lsOutput struct {
	mu   sync.Mutex
	w    *bufio.Writer
	json bool
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
}{{valueKey, "value"}, {clientsKey, "clients"}, {holdersKey, "holders"}}

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
		passes = append(passes, lsPass{keyOf(own, k.suffix), k.kind})
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
	state      []*redis.IntCmd  // a registry's first client: EXISTS of each algorithm's state key
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
			c.fields = pipe.HMGet(ctx, c.key, hashFields...)
		case c.typ != nil && c.typ.Val() == "string":
			c.value = pipe.Get(ctx, c.key)
		case c.first != nil && c.exists.Val() == 0 && len(c.first.Val()) == 1:
			for _, s := range perClientState {
				c.state = append(c.state, pipe.Exists(ctx, keyOf(c.full, s.suffix+":"+c.first.Val()[0])))
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
			out.print(line)
		case c.kind == clientsKey && c.exists.Val() == 0:
			out.unknown++
		}
	}
	return out.w.Flush()
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
		if name, ok := a.nameOf(key); ok {
			return &candidate{name: name, full: key, key: key, kind: ownKey}
		}
	}
	for _, k := range stateKeys {
		if kinds&k.kind == 0 {
			continue
		}
		full, ok := ownerOf(key, k.suffix)
		if !ok {
			continue
		}
		if name, ok := a.nameOf(full); ok {
			return &candidate{name: name, full: full, key: key, kind: k.kind}
		}
	}
	return nil
}

// ownerOf returns the limiter key whose suffix key is key (keyOf's inverse).
func ownerOf(key, suffix string) (string, bool) {
	base, ok := strings.CutSuffix(key, ":"+suffix)
	if !ok {
		return "", false
	}
	if inner, ok := strings.CutPrefix(base, "{"); ok && strings.HasSuffix(inner, "}") && keyOf(inner[:len(inner)-1], suffix) == key {
		return inner[:len(inner)-1], true
	}
	return base, keyOf(base, suffix) == key
}

// line says what c found; no Algorithm when it is no limiter's, or one
// listed by its own key.
func (c *candidate) line() (lsLine, error) {
	line := lsLine{Name: c.name, Key: c.full}
	switch {
	case c.value != nil:
		line.Algorithm = stringAlgorithm(c.value.Val())
	case c.fields != nil:
		f, err := c.fields.Result()
		if isWrongType(err) || err == redis.Nil {
			return lsLine{}, nil // no longer a hash: deleted or replaced since
		}
		if err != nil {
			return lsLine{}, err
		}
		alg, stored := classify(f)
		line.Algorithm = alg
		switch {
		case alg == inFlightAlgorithm:
			cfg, err := storedInFlight(f, c.name)
			if err != nil {
				line.Corrupt = err.Error()
			} else {
				line.InFlight = cfg
			}
		case alg != "" && stored:
			cfg, err := storedConfig(f)
			if err != nil {
				line.Corrupt = err.Error()
			} else {
				line.Config = toJSON(cfg)
			}
		}
	case c.kind == valueKey && c.exists.Val() == 0:
		line.Algorithm = "tokenbucket" // Overall, on a default
	case c.kind == holdersKey && c.exists.Val() == 0:
		line.Algorithm = inFlightAlgorithm // on a default
	case c.state != nil:
		for i, n := range c.state {
			if n.Val() > 0 {
				line.Algorithm = perClientState[i].algorithm
				break
			}
		}
	}
	return line, nil
}

func (o *lsOutput) print(l lsLine) {
	if o.json {
		b, _ := json.Marshal(l) // plain strings and integers: cannot fail
		o.w.Write(append(b, '\n'))
		return
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
	// Fixed widths, not a tabwriter: that would hold every line until the end.
	fmt.Fprintf(o.w, "%-24s  %-14s  %s\n", l.Name, l.Algorithm, about)
}

// storedConfig reads the config fields HMGET returned (hashFields' order).
// The scripts check them the same way before every decision.
func storedConfig(f []any) (redlimit.Config, error) {
	var n [6]int64
	for i := range n {
		s, ok := f[i].(string)
		if !ok {
			if i < 2 {
				return redlimit.Config{}, fmt.Errorf("field %s missing", hashFields[i])
			}
			continue // type, burst, buckets, keepAliveTime: optional
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			return redlimit.Config{}, fmt.Errorf("field %s = %q", hashFields[i], s)
		}
		n[i] = v
	}
	cfg := redlimit.Config{Rate: n[0], Interval: time.Duration(n[1]) * time.Millisecond, Type: redlimit.RateType(n[2]),
		Burst: n[3], Buckets: int(n[4]), KeepAlive: time.Duration(n[5]) * time.Millisecond}
	more, _ := f[fieldMore].(string)
	// Four integers a rate: rate, interval in ms, burst, buckets.
	fields := strings.Fields(more)
	if len(fields)%4 != 0 {
		return redlimit.Config{}, fmt.Errorf("field more = %q", more)
	}
	for i := 0; i < len(fields); i += 4 {
		var r [4]int64
		for j := range r {
			v, err := strconv.ParseInt(fields[i+j], 10, 64)
			if err != nil || v < 0 {
				return redlimit.Config{}, fmt.Errorf("field more = %q", more)
			}
			r[j] = v
		}
		cfg.More = append(cfg.More, redlimit.Config{Rate: r[0], Interval: time.Duration(r[1]) * time.Millisecond, Burst: r[2], Buckets: int(r[3])})
	}
	// The calendar rates: "place=spec", place 1 for the config's own rate.
	calendars, _ := f[fieldCalendar].(string)
	for item := range strings.SplitSeq(calendars, ",") {
		if item == "" {
			continue
		}
		place, spec, _ := strings.Cut(item, "=")
		var cal redlimit.Calendar
		i, err := strconv.Atoi(place)
		if err == nil {
			err = cal.UnmarshalText([]byte(spec))
		}
		switch {
		case err != nil || i < 1 || i > 1+len(cfg.More):
			return redlimit.Config{}, fmt.Errorf("field calendar = %q", calendars)
		case i == 1:
			cfg.Calendar = cal
		default:
			cfg.More[i-2].Calendar = cal
		}
	}
	return cfg, nil
}

// nameOf returns the name of the limiter whose hash is key, or false when
// key cannot be one: outside the prefix, or another key of a limiter
// (prefix{name}:suffix: a PerClient hash such as :tat:<client> looks like a
// funnel's).
func (a *admin) nameOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, a.prefix)
	if !ok || rest == "" || isSuffixKey(key) {
		return "", false
	}
	// prefix{name} names name; a name that holds a tag keeps it as it is.
	if inner, ok := strings.CutPrefix(rest, "{"); ok && strings.HasSuffix(inner, "}") {
		if name := inner[:len(inner)-1]; fullName(a.prefix, name) == key {
			return name, true
		}
	}
	return rest, fullName(a.prefix, rest) == key
}

// fullName is the key of a limiter's hash, as Limiter.Name returns it (the
// README's "Keys in Redis"; TestLs checks the two agree), without making a
// handle per key SCAN returns.
func fullName(prefix, name string) string {
	if prefix == "" || strings.Contains(prefix, "{") || strings.Contains(name, "{") {
		return prefix + name
	}
	return prefix + "{" + name + "}"
}

// suffixes are the words a limiter's other keys add after its name
// ("Keys in Redis" in the README).
var suffixes = []string{"value", "permits", "grants", "clients", "requests", "tat", "window", "buckets", "holders"}

// isSuffixKey reports whether key is name:suffix for a name with a hash tag:
// after the tag, a ':' and one of the suffix words, alone or before a ':'.
func isSuffixKey(key string) bool {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return false
	}
	closing := strings.IndexByte(key[open:], '}')
	if closing < 0 {
		return false
	}
	rest := key[open+closing+1:]
	for i := 0; i < len(rest); i++ {
		if rest[i] != ':' {
			continue
		}
		for _, s := range suffixes {
			if after, ok := strings.CutPrefix(rest[i+1:], s); ok && (after == "" || after[0] == ':') {
				return true
			}
		}
	}
	return false
}

// matchPattern is SCAN's MATCH for limiter names matching pattern: under a
// prefix, prefix{pattern}, as the library names them. A name that holds a
// tag of its own keeps it, so such names are found without a pattern, or
// with a pattern that has the tag.
func matchPattern(prefix, pattern string) string {
	p := globEscape(prefix)
	switch {
	case pattern == "":
		return p + "*"
	case prefix == "" || strings.Contains(prefix+pattern, "{"):
		return p + pattern
	}
	return p + "{" + pattern + "}"
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
