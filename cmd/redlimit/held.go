package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/wire"
)

// What get shows of a limiter with no config stored: it runs on its
// handles' default, which lives in the services, so the rate that would
// turn its state into permits is not in Redis. get reads every key of its
// layout (internal/wire) and says what each holds in the state's own terms:
// times, counts, records. Only GET, HMGET, ZRANGE, TYPE and PTTL, as the
// command's ACL in docs/operations.md allows, and nothing is written.

// heldJSON is what Redis holds for a limiter with no config stored.
type heldJSON struct {
	// Keys are the limiter's keys that exist: its own, its Overall state's,
	// the registry, the request log, then each registered client's state.
	Keys []heldKey `json:"keys"`
}

// heldKey is one key and what it holds.
type heldKey struct {
	Key   string `json:"key"`
	Type  string `json:"type"`   // Redis's TYPE
	TTLMS int64  `json:"ttl_ms"` // PTTL: -1 for no expiry
	// Holds is what the key is: "flat state" or "marker" (the limiter's key
	// as a string), "state" (a hash of state fields), a token bucket's
	// "value" (its rate less the permits its log holds, as Redisson caches
	// it), "permits log" and "grants log" (its further rates'), "registry",
	// "request log".
	Holds  string `json:"holds"`
	Client string `json:"client,omitempty"` // a PerClient client's state
	// Rates are the state by rate: 1 the first, 2 … the further ones.
	Rates []rateHeld `json:"rates,omitempty"`
	// Value is a token bucket's value key: its rate less the permits its
	// log holds (Redisson's cache), read as it is.
	Value *int64 `json:"value,omitempty"`
	// Clients are the registry's: each id and when it was last granted.
	Clients []clientSeen `json:"clients,omitempty"`
	// Corrupt says why the key could not be read as the algorithm writes it.
	Corrupt string `json:"corrupt,omitempty"`
}

// rateHeld is one rate's state, in the algorithm's own terms; the fields
// another algorithm keeps are absent.
type rateHeld struct {
	Rate int `json:"rate"`
	// A funnel's: its theoretical arrival time (µs, Redis's clock), the
	// time until it is empty, and whether a charge's debt is owed.
	TATUS     *int64 `json:"tat_us,omitempty"`
	EmptyInMS *int64 `json:"empty_in_ms,omitempty"`
	Owed      bool   `json:"owed,omitempty"`
	// A fixed window's start (ms since the epoch), and a sliding window's
	// sub-windows.
	WindowStartMS *int64      `json:"window_start_ms,omitempty"`
	SubWindows    []subWindow `json:"sub_windows,omitempty"`
	// Count is the permits counted: a fixed window's in its window, a
	// sliding window's in its sub-windows, a token bucket's in its records.
	Count *int64 `json:"count,omitempty"`
	// A token bucket's log: its records, and the oldest's and newest's
	// times (ms since the epoch).
	Records  *int   `json:"records,omitempty"`
	OldestMS *int64 `json:"oldest_ms,omitempty"`
	NewestMS *int64 `json:"newest_ms,omitempty"`
}

type subWindow struct {
	StartMS int64 `json:"start_ms"`
	Count   int64 `json:"count"`
}

type clientSeen struct {
	ID            string `json:"id"`
	LastGrantedMS int64  `json:"last_granted_ms"` // ms since the epoch
}

// state: some key holds usage (not only a marker, a registry or a log).
func (h *heldJSON) state() bool {
	for _, k := range h.Keys {
		if len(k.Rates) > 0 || k.Value != nil {
			return true
		}
	}
	return false
}

// heldRead is one key get reads, and the commands reading it.
type heldRead struct {
	heldKey
	alg   *wire.Algorithm // whose layout names the key; nil: any algorithm's
	state int             // its place in alg.State; -1 for the limiter's key, registry, log
	typ   *redis.StatusCmd
	ttl   *redis.DurationCmd
	str   *redis.StringCmd
	hash  *redis.SliceCmd
	zset  *redis.ZSliceCmd
}

// readHeld reads what Redis holds under the limiter key full of alg, or of
// any algorithm when alg is nil (nothing told it), as of now.
func (a *admin) readHeld(ctx context.Context, full string, alg *wire.Algorithm, now time.Time) (*heldJSON, error) {
	algs := wire.Algorithms
	if alg != nil {
		algs = []*wire.Algorithm{alg}
	}
	registry := wire.KeyOf(full, wire.SuffixClients)
	seen, err := a.rdb.ZRangeWithScores(ctx, registry, 0, -1).Result()
	if err != nil && !isWrongType(err) {
		return nil, fmt.Errorf("reading %s: %w", registry, err)
	}
	reads := []*heldRead{{heldKey: heldKey{Key: full}, alg: alg, state: -1}}
	stateKeys := func(client string) {
		for _, x := range algs {
			if x.InConfig && client == "" {
				continue // fields of the limiter's key
			}
			for i, key := range x.StateKeys(full, client) {
				reads = append(reads, &heldRead{heldKey: heldKey{Key: key, Client: client}, alg: x, state: i})
			}
		}
	}
	stateKeys("")
	reads = append(reads, &heldRead{heldKey: heldKey{Key: registry, Holds: "registry"}, state: -1},
		&heldRead{heldKey: heldKey{Key: wire.KeyOf(full, wire.SuffixRequests), Holds: "request log"}, state: -1})
	for _, z := range seen {
		if id, ok := z.Member.(string); ok {
			stateKeys(id)
		}
	}
	pipe := a.rdb.Pipeline()
	for _, r := range reads {
		r.typ, r.ttl = pipe.Type(ctx, r.Key), pipe.PTTL(ctx, r.Key)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	var held []*heldRead
	for _, r := range reads {
		if r.Type = r.typ.Val(); r.Type == "none" {
			continue
		}
		r.TTLMS = ttlMS(r.ttl.Val())
		held = append(held, r)
		switch {
		case r.Key == registry:
			continue // read already
		case r.Type == "string":
			r.str = pipe.Get(ctx, r.Key)
		case r.Type == "hash":
			r.hash = pipe.HMGet(ctx, r.Key, rateFields(algs)...)
		case r.Type == "zset" && r.state >= 0:
			r.zset = pipe.ZRangeWithScores(ctx, r.Key, 0, -1)
		}
	}
	if pipe.Len() > 0 {
		// A key gone since: redis.Nil, read below as nothing.
		if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil && !isWrongType(err) {
			return nil, err
		}
	}
	rep := &heldJSON{Keys: []heldKey{}}
	fields := rateFields(algs)
	for _, r := range held {
		r.describe(full, registry, fields, seen, now)
		rep.Keys = append(rep.Keys, r.heldKey)
	}
	return rep, nil
}

// ttlMS is PTTL's answer in ms: -1 for no expiry.
func ttlMS(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return ms(d)
}

// rateFields are the state fields of algs for every rate a config may
// have: each field, suffixed with each rate's K.
func rateFields(algs []*wire.Algorithm) []string {
	var fields []string
	for k := range wire.MaxRates {
		for _, x := range algs {
			for _, f := range x.Fields {
				fields = append(fields, f+wire.RateSuffix(k))
			}
		}
	}
	return fields
}

// describe reads what r holds.
// fields are the hash fields read (rateFields).
func (r *heldRead) describe(full, registry string, fields []string, seen []redis.Z, now time.Time) {
	switch {
	case r.Key == registry:
		if r.Type != "zset" {
			r.Corrupt = "a " + r.Type + ", not a zset"
			return
		}
		for _, z := range seen {
			id, _ := z.Member.(string)
			r.Clients = append(r.Clients, clientSeen{ID: id, LastGrantedMS: int64(z.Score)})
		}
	case r.Holds == "request log":
	case r.Key == full && r.Type == "string":
		value := r.str.Val()
		owner := wire.OwnerOf(value)
		alg := wire.AlgorithmNamed(owner)
		switch {
		case owner == value && alg != nil:
			r.Holds = "marker"
			return
		case alg == nil:
			r.Holds, r.Corrupt = "string", fmt.Sprintf("%q: no algorithm's state", value)
			return
		}
		r.Holds = "flat state"
		fields, ok := alg.FlatFields(value)
		if !ok {
			r.Corrupt = fmt.Sprintf("%q: not a %s's flat state", value, alg.Name)
			return
		}
		r.rates(alg, fields, now)
	case r.Type == "hash" && (r.Key == full || r.alg != nil && r.alg.InConfig):
		r.Holds = "state"
		values := map[string]string{}
		for i, v := range r.hash.Val() {
			if s, ok := v.(string); ok && i < len(fields) {
				values[fields[i]] = s
			}
		}
		alg := r.alg
		if alg == nil {
			owner, _ := wire.HashOwner(func(f string) (string, bool) { v, ok := values[f]; return v, ok })
			if alg = wire.AlgorithmNamed(owner); alg == nil {
				r.Corrupt = "no algorithm's state fields"
				return
			}
		}
		r.rates(alg, values, now)
	case r.Key == full:
		r.Holds, r.Corrupt = "key", "a "+r.Type+", not a limiter's hash or string"
	case r.alg != nil && r.alg.Types[r.state] != r.Type:
		r.Holds, r.Corrupt = r.alg.State[r.state], "a "+r.Type+", not a "+r.alg.Types[r.state]
	case r.alg == wire.TokenBucket && r.state == 0:
		r.Holds = r.alg.State[r.state]
		v, err := strconv.ParseInt(r.str.Val(), 10, 64)
		if err != nil {
			r.Corrupt = fmt.Sprintf("%q: not an integer", r.str.Val())
			return
		}
		r.Value = &v
	case r.alg == wire.TokenBucket && r.state == 1:
		r.Holds = r.alg.State[r.state] + " log"
		r.records(r.zset.Val(), permitsRecord)
	case r.alg == wire.TokenBucket && r.state == 2:
		r.Holds = r.alg.State[r.state] + " log"
		r.records(r.zset.Val(), grantsRecord)
	default:
		r.Holds = "key"
	}
}

// rates reads alg's state fields, each rate's suffixed with its K.
func (r *heldRead) rates(alg *wire.Algorithm, fields map[string]string, now time.Time) {
	for k := range wire.MaxRates {
		K := wire.RateSuffix(k)
		values := make([]string, len(alg.Fields))
		found := false
		for i, f := range alg.Fields {
			values[i] = fields[f+K]
			found = found || values[i] != ""
		}
		if !found {
			continue
		}
		rate, err := readRate(alg, values, now)
		if err != nil {
			r.Corrupt = fmt.Sprintf("rate %d: %v", k+1, err)
			return
		}
		rate.Rate = k + 1
		r.Rates = append(r.Rates, rate)
	}
}

// readRate reads one rate's state fields as the algorithm's script writes
// them (scripts/*.lua: each module's encode).
func readRate(alg *wire.Algorithm, v []string, now time.Time) (rateHeld, error) {
	var rate rateHeld
	bad := func() (rateHeld, error) { return rateHeld{}, fmt.Errorf("%s = %q", strings.Join(alg.Fields, ", "), v) }
	switch alg {
	case wire.Funnel:
		// 'µs', 'µs,remainder' (in 1/rate µs), then ',1' while owed.
		parts := strings.Split(v[0], ",")
		tat, err := strconv.ParseInt(parts[0], 10, 64)
		if err != nil || len(parts) > 3 || len(parts) == 3 && parts[2] != "1" {
			return bad()
		}
		empty := max(0, tat-now.UnixMicro())
		empty = (empty + 999) / 1000
		rate.TATUS, rate.EmptyInMS, rate.Owed = &tat, &empty, len(parts) == 3
	case wire.FixedWindow:
		start, err1 := strconv.ParseInt(v[0], 10, 64)
		count, err2 := strconv.ParseInt(v[1], 10, 64)
		if err1 != nil || err2 != nil {
			return bad()
		}
		rate.WindowStartMS, rate.Count = &start, &count
	case wire.SlidingWindow:
		// 'start:count' each, oldest first: the first start in ms, each
		// next one as the ms since the one before.
		var start, total int64
		for entry := range strings.SplitSeq(v[0], ",") {
			since, count, ok := strings.Cut(entry, ":")
			s, err1 := strconv.ParseInt(since, 10, 64)
			c, err2 := strconv.ParseInt(count, 10, 64)
			if !ok || err1 != nil || err2 != nil {
				return bad()
			}
			start += s
			total += c
			rate.SubWindows = append(rate.SubWindows, subWindow{StartMS: start, Count: c})
		}
		rate.Count = &total
	default:
		return bad()
	}
	return rate, nil
}

// furtherScores is the range of scores each further rate's records take in
// a token bucket's grants log (scripts/tokenbucket.lua): rate k's are its
// grants' times in ms plus (k − 2) × 2^45.
const furtherScores = 1 << 45

// permitsRecord reads a record of a token bucket's permits log (Redisson's
// layout): its permits are its member's last 4 bytes, little-endian.
func permitsRecord(member string, score float64) (rate int, permits, at int64, ok bool) {
	if len(member) < 5 {
		return 0, 0, 0, false
	}
	return 1, int64(binary.LittleEndian.Uint32([]byte(member[len(member)-4:]))), int64(score), true
}

// grantsRecord reads a record of a token bucket's grants log: its member is
// the rate's running total, ':', the record's own permits, then ':k' for
// rate k > 2.
func grantsRecord(member string, score float64) (rate int, permits, at int64, ok bool) {
	parts := strings.Split(member, ":")
	rate = 2
	if len(parts) == 3 {
		rate, _ = strconv.Atoi(parts[2])
	}
	n, err := strconv.ParseInt(parts[min(1, len(parts)-1)], 10, 64)
	if len(parts) < 2 || len(parts) > 3 || err != nil || rate < 2 || rate > wire.MaxRates {
		return 0, 0, 0, false
	}
	return rate, n, int64(score) - int64(rate-2)*furtherScores, true
}

// records sums a token bucket's log by rate: its records, their permits,
// the oldest's and newest's times.
func (r *heldRead) records(log []redis.Z, read func(member string, score float64) (int, int64, int64, bool)) {
	byRate := map[int]*rateHeld{}
	for _, z := range log {
		member, _ := z.Member.(string)
		k, permits, at, ok := read(member, z.Score)
		if !ok {
			r.Corrupt = fmt.Sprintf("record %q", member)
			return
		}
		rate := byRate[k]
		if rate == nil {
			rate = &rateHeld{Rate: k, Records: new(0), Count: new(int64(0)), OldestMS: new(at), NewestMS: new(at)}
			byRate[k] = rate
		}
		*rate.Records++
		*rate.Count += permits
		*rate.OldestMS, *rate.NewestMS = min(*rate.OldestMS, at), max(*rate.NewestMS, at)
	}
	for k := 1; k <= wire.MaxRates; k++ {
		if rate := byRate[k]; rate != nil {
			r.Rates = append(r.Rates, *rate)
		}
	}
}

// nothingHeld is get's word for a name with no config and no state.
func nothingHeld(name string) string {
	return "nothing held in Redis for " + name + ": no stored config and no state; a limiter on a default keeps state only while it is in use"
}

// print writes what h holds, as of now.
func (h *heldJSON) print(w io.Writer, name string, now time.Time) {
	if !h.state() {
		fmt.Fprintf(w, "\n%s.\n", nothingHeld(name))
		if len(h.Keys) == 0 {
			return
		}
		fmt.Fprintf(w, "Its keys left:\n")
	} else {
		fmt.Fprintf(w, "\nHeld in Redis, in the state's own terms (no config stored: --rate and --per give permits):\n")
	}
	ago := func(ms int64) string {
		d := now.Sub(time.UnixMilli(ms))
		if d < 0 {
			return fmt.Sprintf("%v ahead", -d)
		}
		return fmt.Sprintf("%v ago", d)
	}
	for _, k := range h.Keys {
		what := k.Holds
		if k.Client != "" {
			what = k.Client + "'s " + what
		}
		expires := "never expires"
		if k.TTLMS >= 0 {
			expires = fmt.Sprintf("expires in %v", time.Duration(k.TTLMS)*time.Millisecond)
		}
		fmt.Fprintf(w, "  %s  %s; %s\n", k.Key, what, expires)
		switch {
		case k.Corrupt != "":
			fmt.Fprintf(w, "    corrupt: %s\n", k.Corrupt)
		case k.Holds == "marker":
			fmt.Fprintf(w, "    the algorithm's name: its state is in the keys below\n")
		case k.Value != nil:
			fmt.Fprintf(w, "    %d: the rate less the permits its log holds\n", *k.Value)
		}
		width := 0
		for _, c := range k.Clients {
			width = max(width, len(c.ID))
		}
		for _, c := range k.Clients {
			fmt.Fprintf(w, "    %-*s  last granted %s\n", width, c.ID, ago(c.LastGrantedMS))
		}
		for _, r := range k.Rates {
			fmt.Fprintf(w, "    rate %d: %s\n", r.Rate, r.describe(ago))
		}
	}
}

// describe says what one rate holds.
func (r rateHeld) describe(ago func(ms int64) string) string {
	switch {
	case r.TATUS != nil:
		s := fmt.Sprintf("empty in %v (TAT %d µs)", time.Duration(*r.EmptyInMS)*time.Millisecond, *r.TATUS)
		if r.Owed {
			s += "; owed: a charge took it past full"
		}
		return s
	case r.WindowStartMS != nil:
		return fmt.Sprintf("%d counted in the window from %s (%s)", *r.Count, time.UnixMilli(*r.WindowStartMS).UTC().Format(asOfLayout), ago(*r.WindowStartMS))
	case r.SubWindows != nil:
		oldest, newest := r.SubWindows[0].StartMS, r.SubWindows[len(r.SubWindows)-1].StartMS
		if len(r.SubWindows) == 1 {
			return fmt.Sprintf("%d counted in 1 sub-window, from %s (%s)", *r.Count, time.UnixMilli(oldest).UTC().Format(asOfLayout), ago(oldest))
		}
		return fmt.Sprintf("%d counted in %d sub-windows, from %s (%s) to %s (%s)", *r.Count, len(r.SubWindows),
			time.UnixMilli(oldest).UTC().Format(asOfLayout), ago(oldest), time.UnixMilli(newest).UTC().Format(asOfLayout), ago(newest))
	case r.Records != nil:
		if *r.Records == 1 {
			return fmt.Sprintf("%d permits in 1 record, granted %s", *r.Count, ago(*r.NewestMS))
		}
		return fmt.Sprintf("%d permits in %d records, the newest granted %s, the oldest %s", *r.Count, *r.Records, ago(*r.NewestMS), ago(*r.OldestMS))
	}
	return ""
}
