package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// ls lists the limiters in Redis: the hashes at prefix{name} that hold a
// config or an algorithm's state. It SCANs (never KEYS, which blocks Redis
// for as long as it takes over every key), every primary of a Cluster, and
// prints each batch as it comes: memory stays one batch whatever the number
// of keys.
func ls(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := newAdmin("ls", "ls [flags] [PATTERN]", `Lists the limiters in Redis, one line each: name, algorithm and stored
config, or "none stored" for one running on its handles' default. PATTERN is
a Redis glob over limiter names (without the prefix), such as 'user:*'. It
reads with SCAN (on every primary of a Cluster), so Redis keeps serving
however many keys it holds; the order is SCAN's. With --json, one JSON object
per line.

A limiter appears here while its hash exists: a stored config, or usage
counted on a default (funnel, fixed and sliding windows). A token bucket or
a PerClient limiter running on a default keeps no hash; get finds those by
name.

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
		return usageError(a.fs, "--count %d: want 1 to 100000", *count)
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
	scan := func(ctx context.Context, node redis.Cmdable) error {
		return a.scan(ctx, node, matchPattern(a.prefix, pattern), *count, out)
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
	return exitOK
}

// lsOutput is shared by the scans of a Cluster's primaries.
type lsOutput struct {
	mu   sync.Mutex
	w    *bufio.Writer
	json bool
}

// lsLine is ls's JSON, one object per line.
type lsLine struct {
	Name      string      `json:"name"`
	Key       string      `json:"key"`
	Algorithm string      `json:"algorithm"`
	Config    *configJSON `json:"config"` // null: none stored
	// Corrupt says why a stored config could not be read; the limiter's
	// calls fail with ErrCorruptState.
	Corrupt string `json:"corrupt,omitempty"`
}

// scan walks one node's keyspace, a SCAN call at a time, and prints the
// limiters among each call's keys before asking for more.
func (a *admin) scan(ctx context.Context, node redis.Cmdable, match string, count int64, out *lsOutput) error {
	// A limiter's key is a hash, or a string holding a flat state; TYPE has
	// Redis leave out the other keys itself (Redis 6+).
	for _, typ := range []string{"hash", "string"} {
		var cursor uint64
		for {
			keys, next, err := node.ScanType(ctx, cursor, match, count, typ).Result()
			if err != nil {
				return err
			}
			if err := a.describe(ctx, keys, typ == "string", out); err != nil {
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

// describe reads the keys that may be limiters (hashes, or strings when
// flat), in one pipeline, and prints those that are.
func (a *admin) describe(ctx context.Context, keys []string, flat bool, out *lsOutput) error {
	type candidate struct {
		name, key string
		fields    *redis.SliceCmd
		value     *redis.StringCmd
	}
	var batch []candidate
	pipe := a.rdb.Pipeline()
	for _, key := range keys {
		if name, ok := a.nameOf(key); ok && flat {
			batch = append(batch, candidate{name: name, key: key, value: pipe.Get(ctx, key)})
		} else if ok {
			batch = append(batch, candidate{name: name, key: key, fields: pipe.HMGet(ctx, key, hashFields...)})
		}
	}
	if len(batch) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !isWrongType(err) && err != redis.Nil {
		return err
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	for _, c := range batch {
		if flat {
			// A flat state: no config stored (scripts/common.lua).
			if alg := flatAlgorithm(c.value.Val()); alg != "" {
				out.print(lsLine{Name: c.name, Key: c.key, Algorithm: alg})
			}
			continue
		}
		f, err := c.fields.Result()
		if isWrongType(err) || err == redis.Nil {
			continue // no longer a hash: deleted or replaced since SCAN saw it
		}
		if err != nil {
			return err
		}
		alg, stored := classify(f)
		if alg == "" {
			continue // a hash, but none of a limiter's fields
		}
		line := lsLine{Name: c.name, Key: c.key, Algorithm: alg}
		if stored {
			cfg, err := storedConfig(f)
			if err != nil {
				line.Corrupt = err.Error()
			} else {
				line.Config = toJSON(cfg)
			}
		}
		out.print(line)
	}
	return out.w.Flush()
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
	more, _ := f[len(f)-1].(string)
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
var suffixes = []string{"value", "permits", "grants", "clients", "requests", "tat", "window", "buckets"}

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
