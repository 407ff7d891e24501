package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/wire"
)

// admin is what the admin commands share: a real Redis, a prefix, and
// whether a read command answers in JSON.
type admin struct {
	name   string // the command, for messages
	fs     *flag.FlagSet
	be     backend
	prefix string
	json   bool

	stdout, stderr io.Writer
	rdb            redis.UniversalClient
	client         *redlimit.Client
}

// newAdmin declares the flags every admin command has; read commands also get --json.
func newAdmin(name, synopsis, about string, read bool, stdout, stderr io.Writer) *admin {
	a := &admin{name: name, fs: newFlagSet(name, synopsis, about, stderr), stdout: stdout, stderr: stderr}
	a.be.addFlags(a.fs)
	a.fs.StringVar(&a.prefix, "prefix", "", "the services' redlimit.WithPrefix")
	if read {
		a.fs.BoolVar(&a.json, "json", false, "answer in JSON, for scripts")
	}
	return a
}

// parse reads the command line, flags and arguments in any order (`set NAME
// --rate 10` reads as an operator types it), and returns the arguments.
func (a *admin) parse(args []string) (_ []string, code int, ok bool) {
	var pos []string
	for {
		if code, ok := parseFlags(a.fs, args); !ok {
			return nil, code, false
		}
		rest := a.fs.Args()
		if len(rest) == 0 {
			return pos, 0, true
		}
		if i := len(args) - len(rest) - 1; i >= 0 && args[i] == "--" { // everything after -- is an argument
			return append(pos, rest...), 0, true
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// connect checks the backend flags and connects. It returns a non-zero exit
// code when it could not.
func (a *admin) connect(ctx context.Context) int {
	if err := a.be.check(); err != nil {
		return invalid(a.fs, "%v", err)
	}
	if !a.be.real() {
		// An embedded Redis would start empty: nothing to inspect or change.
		return usageError(a.fs, "name the Redis holding the limiters: --redis, --cluster or --sentinel")
	}
	if err := a.be.open(ctx); err != nil {
		return a.fail(err)
	}
	a.rdb = a.be.newClient()
	a.client = redlimit.New(a.rdb, redlimit.WithPrefix(a.prefix))
	return exitOK
}

func (a *admin) close() {
	if a.rdb != nil {
		_ = a.rdb.Close()
	}
}

// fail reports err and returns its exit code: a name the library refuses is
// a bad command line, anything else a failed command.
func (a *admin) fail(err error) int {
	if errors.Is(err, redlimit.ErrInvalidName) || errors.Is(err, redlimit.ErrInvalidConfig) {
		return invalid(a.fs, "%v", err)
	}
	fmt.Fprintf(a.stderr, "redlimit %s: %s\n", a.name, strings.TrimPrefix(err.Error(), "redlimit: "))
	return exitFail
}

func (a *admin) notFound(name string) int {
	fmt.Fprintf(a.stderr, "redlimit %s: no limiter %q in %v (no key %s)\n", a.name, name, &a.be, a.client.TokenBucket(name).Name())
	return exitNotFound
}

// algorithmNamed returns the constructor of the algorithm stored as name.
func algorithmNamed(name string) func(*redlimit.Client, string) *redlimit.Limiter {
	for _, alg := range algorithms {
		if alg.name == name {
			return alg.limiter
		}
	}
	return nil
}

// ownKeyFields is what ls and locate read of a limiter's hash (HMGET): the
// config's fields, its algorithm and shadow mode, an in-flight limit's
// config, then every algorithm's Overall state fields: enough to tell whose
// hash it is (wire.HashOwner) and to read its config. The layout is
// internal/wire's: the command reads it from there.
var ownKeyFields = slices.Concat(wire.ConfigFields,
	[]string{wire.FieldAlgorithm, wire.FieldShadow, wire.FieldLimit, wire.FieldTTL}, wire.StateFields())

// hashFields are the fields of ownKeyFields a limiter's hash holds, by name.
type hashFields map[string]string

// readFields names the values HMGET returned for ownKeyFields.
func readFields(f []any) hashFields {
	h := hashFields{}
	for i, v := range f {
		if s, ok := v.(string); ok && i < len(ownKeyFields) {
			h[ownKeyFields[i]] = s
		}
	}
	return h
}

func (h hashFields) field(name string) (string, bool) {
	v, ok := h[name]
	return v, ok
}

// owner is the algorithm whose hash it is ("" for none), and whether it
// holds a config, as the admin script tells them.
func (h hashFields) owner() (string, bool) { return wire.HashOwner(h.field) }

// shadow: the stored config is in shadow mode (Limiter.SetShadow).
func (h hashFields) shadow() bool { return h[wire.FieldShadow] == "1" }

// located is what locate found of a limiter.
type located struct {
	algorithm string // "" when nothing tells a limiter
	config    bool   // its hash holds a config
	shadow    bool   // in shadow mode (kept with the config)
}

// locate finds which algorithm holds name, reading only: the hash's fields,
// or the string a limiter on a default keeps (a flat state or a marker,
// wire.OwnerOf); without either, the token bucket's Overall state keys, an
// in-flight limit's holds, then a PerClient limiter's registry and its
// latest client's state keys. No algorithm means there is no limiter of that
// name that the command can tell.
func (a *admin) locate(ctx context.Context, name string) (located, error) {
	l := a.client.TokenBucket(name)
	if name == "" || strings.Contains(name, "{") {
		// Only these can be invalid; the library has the rule, and says so
		// on its first call (a read).
		if _, err := l.RemainTimeToLive(ctx); errors.Is(err, redlimit.ErrInvalidName) {
			return located{}, err
		}
	}
	full := l.Name()
	f, err := a.rdb.HMGet(ctx, full, ownKeyFields...).Result()
	if isWrongType(err) {
		if alg := wire.OwnerOf(a.rdb.Get(ctx, full).Val()); alg != "" {
			return located{algorithm: alg}, nil
		}
		return located{}, fmt.Errorf("%s is a %s, not a limiter's hash or flat state", full, a.rdb.Type(ctx, full).Val())
	}
	if err != nil {
		return located{}, fmt.Errorf("reading %s: %w", full, err)
	}
	h := readFields(f)
	if alg, config := h.owner(); alg != "" {
		return located{algorithm: alg, config: config, shadow: config && h.shadow()}, nil
	}
	exists := func(keys ...string) (bool, error) {
		n, err := a.rdb.Exists(ctx, keys...).Result()
		if err != nil {
			return false, fmt.Errorf("reading %s: %w", full, err)
		}
		return n > 0, nil
	}
	// A token bucket on a default whose state came before markers (or
	// Redisson's); an in-flight limit on its handles' default, with holds
	// (or holds just expired: the key lives as long as the latest).
	for _, on := range []struct {
		alg  string
		keys []string
	}{
		{wire.TokenBucket.Name, wire.TokenBucket.StateKeys(full, "")},
		{inFlightAlgorithm, []string{wire.KeyOf(full, wire.SuffixHolders)}},
	} {
		if found, err := exists(on.keys...); err != nil || found {
			return located{algorithm: on.alg}, err
		}
	}
	// The latest client to be granted: its state is the likeliest to be left.
	ids, err := a.rdb.ZRange(ctx, wire.KeyOf(full, wire.SuffixClients), -1, -1).Result()
	if err != nil || len(ids) == 0 {
		return located{}, nil // no registry, or not a zset: not one of ours
	}
	for _, alg := range wire.Algorithms {
		if found, err := exists(alg.StateKeys(full, ids[0])...); err != nil || found {
			return located{algorithm: alg.Name}, err
		}
	}
	return located{}, nil
}

func isWrongType(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE")
}

// limiter returns a handle on an existing limiter and what locate found of
// it, or an exit code. An in-flight limit has no Limiter: its handle is
// a.client.InFlight(name), and l is nil.
func (a *admin) limiter(ctx context.Context, name string) (*redlimit.Limiter, located, int) {
	at, err := a.locate(ctx, name)
	if err != nil {
		return nil, at, a.fail(err)
	}
	l, code := a.handle(name, at)
	return l, at, code
}

// handle is limiter's, for a limiter located already.
func (a *admin) handle(name string, at located) (*redlimit.Limiter, int) {
	switch alg := at.algorithm; {
	case alg == "":
		return nil, a.notFound(name)
	case alg == inFlightAlgorithm:
		return nil, exitOK
	case algorithmNamed(alg) == nil:
		return nil, a.fail(fmt.Errorf("%s holds an algorithm this command does not know: %q", a.client.TokenBucket(name).Name(), alg))
	}
	return algorithmNamed(at.algorithm)(a.client, name), exitOK
}

// configFlags are set's flags, and get's for the default to assume.
type configFlags struct {
	rate      int64
	per       period
	burst     int64
	buckets   int
	perClient bool
	keepAlive time.Duration
	more      moreRates
}

func (c *configFlags) add(fs *flag.FlagSet, what string) {
	fs.Int64Var(&c.rate, "rate", 0, "permits per --per"+what)
	fs.Var(&c.per, "per", "the interval, e.g. 1s, 1m, or a fixed window's calendar period: day:0:ZONE, week:1:ZONE (from Monday), month:31:ZONE (from the 31st)"+what)
	fs.Int64Var(&c.burst, "burst", 0, "funnel only: its capacity (default the rate)")
	fs.IntVar(&c.buckets, "buckets", 0, "sliding window only: sub-windows per interval (default 10)")
	fs.BoolVar(&c.perClient, "per-client", false, "a separate limit for each client ID (Type PerClient)")
	fs.DurationVar(&c.keepAlive, "keep-alive", 0, "the config expires after this long without an acquire (0: never)")
	c.more.options = true
	fs.Var(&c.more, "and", "a further rate, N/PERIOD[,burst=B][,buckets=K] such as 1000/1h; repeat for more (Config.And)")
}

func (c *configFlags) given() bool { return c.rate != 0 || c.per != (period{}) }

// rateFlags are configFlags' names: a rate's, none an in-flight limit's.
var rateFlags = []string{"rate", "per", "burst", "buckets", "per-client", "keep-alive", "and"}

// visited returns the first of names given on fs's command line, or "".
func visited(fs *flag.FlagSet, names ...string) string {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range names {
		if given[name] {
			return name
		}
	}
	return ""
}

// missing says which of --rate and --per is missing when the other is
// given ("" when both or neither are): without it the library would refuse
// a zero, in words that do not name the flag.
func (c *configFlags) missing(fs *flag.FlagSet) string {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	switch {
	case given["rate"] && !given["per"]:
		return "--per is required with --rate"
	case given["per"] && !given["rate"]:
		return "--rate is required with --per"
	}
	return ""
}

func (c *configFlags) config() redlimit.Config {
	cfg := c.per.rate(c.rate)
	cfg.Burst, cfg.Buckets, cfg.KeepAlive = c.burst, c.buckets, c.keepAlive
	if c.perClient {
		cfg.Type = redlimit.PerClient
	}
	return cfg.And(c.more.rates...)
}

// configJSON is a Config for scripts: durations in milliseconds, zero
// Burst and Buckets meaning the algorithm's default.
type configJSON struct {
	Type        string `json:"type"` // overall or per-client
	Rate        int64  `json:"rate"`
	IntervalMS  int64  `json:"interval_ms"`
	Burst       int64  `json:"burst"`
	Buckets     int    `json:"buckets"`
	KeepAliveMS int64  `json:"keep_alive_ms"`
	// Calendar: windows that follow the calendar (Calendar.MarshalText), absent for none.
	Calendar redlimit.Calendar `json:"calendar,omitzero"`
	// More are the further rates (Config.And), absent with one rate.
	More []rateJSON `json:"more,omitempty"`
}

// rateJSON is a further rate: of those, only these fields count.
type rateJSON struct {
	Rate       int64             `json:"rate"`
	IntervalMS int64             `json:"interval_ms"`
	Burst      int64             `json:"burst"`
	Buckets    int               `json:"buckets"`
	Calendar   redlimit.Calendar `json:"calendar,omitzero"`
}

func toJSON(cfg redlimit.Config) *configJSON {
	c := &configJSON{Type: cfg.Type.String(), Rate: cfg.Rate, IntervalMS: cfg.Interval.Milliseconds(),
		Burst: cfg.Burst, Buckets: cfg.Buckets, KeepAliveMS: cfg.KeepAlive.Milliseconds(), Calendar: cfg.Calendar}
	for _, r := range cfg.More {
		c.More = append(c.More, rateJSON{Rate: r.Rate, IntervalMS: r.Interval.Milliseconds(), Burst: r.Burst, Buckets: r.Buckets, Calendar: r.Calendar})
	}
	return c
}

// ms rounds up, so that a script waiting that long has waited long enough.
func ms(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// limitUsage is what a peek (Allow with zero permits) says of one limit.
// A PerClient client listed without a config stored or assumed has -1 in
// every number: its usage cannot be computed without the rate.
type limitUsage struct {
	Client    string `json:"client,omitempty"` // PerClient only
	Limit     int64  `json:"limit"`
	Remaining int64  `json:"remaining"`
	// RetryAfterMS is the wait for one permit, as Allow's RetryAfter would
	// say (rounded up to the ms): 0 when a permit is free now.
	RetryAfterMS int64 `json:"retry_after_ms"`
	// ResetAfterMS is the wait until the limiter is full again.
	ResetAfterMS int64 `json:"reset_after_ms"`
	// Bound is the rate Limit and Remaining are of, as Result.Bound: 0 the
	// config's own, i its more[i-1]. With several rates, Remaining is the
	// fewest any rate has left, and Bound the rate with that few.
	Bound int `json:"bound"`
}

// instant is the clock of get's Client: the one instant a report is of,
// moved only to look ahead (nextPermit).
type instant struct{ t time.Time }

func (i *instant) now() time.Time { return i.t }

// usageTime is the instant get reports usage at: Redis TIME, read once, so
// that every number of a report is of one instant. Tests fix it.
var usageTime = func(ctx context.Context, rdb redis.UniversalClient) (time.Time, error) {
	return rdb.Time(ctx).Result()
}

func peek(ctx context.Context, l *redlimit.Limiter, client string, at *instant) (limitUsage, error) {
	r, err := l.Allow(ctx, 0) // zero permits: reports and writes nothing
	if err != nil {
		return limitUsage{}, err
	}
	u := limitUsage{Client: client, Limit: r.Limit, Remaining: r.Remaining, ResetAfterMS: ms(r.ResetAfter), Bound: r.Bound}
	if r.Remaining < 1 {
		u.RetryAfterMS, err = nextPermit(ctx, l, at, u.ResetAfterMS)
	}
	return u, err
}

// nextPermit finds, to the millisecond, when a limiter with no permit left
// at at.t frees one, with peeks at later instants. A peek's RetryAfter is 0
// (it asks for no permit), and Allow(ctx, 1) would take the permit were one
// free by then: get writes nothing. A limiter frees permits as time passes
// and takes none back without a grant, so the first instant with a permit
// is found by halving (0, reset]: log2 of the reset in ms peeks, 22 for an
// hour.
func nextPermit(ctx context.Context, l *redlimit.Limiter, at *instant, reset int64) (int64, error) {
	now := at.t
	defer func() { at.t = now }()
	none, some := int64(0), reset // full again at reset
	for some-none > 1 {
		mid := none + (some-none)/2
		at.t = now.Add(time.Duration(mid) * time.Millisecond)
		r, err := l.Allow(ctx, 0)
		if err != nil {
			return 0, err
		}
		if r.Remaining >= 1 {
			some = mid
		} else {
			none = mid
		}
	}
	return some, nil
}

// limiterReport is get's answer.
type limiterReport struct {
	Name      string `json:"name"`
	Key       string `json:"key"`
	Algorithm string `json:"algorithm"`
	// Config is the stored config; null when the limiter runs on its
	// handles' default, which lives in the services, not in Redis.
	Config *configJSON `json:"config"`
	// Assumed is get's --rate/--per, used for the usage below when no config is stored.
	Assumed *configJSON `json:"assumed,omitempty"`
	// AsOf is the instant of Usage and Clients (Redis TIME, to the ms): the
	// next permit is due at AsOf + RetryAfterMS.
	AsOf string `json:"as_of"`
	// TTLMS is RemainTimeToLive in milliseconds: -1 when the limiter's keys
	// do not expire (a stored config without KeepAlive or Expire).
	TTLMS int64 `json:"ttl_ms"`
	// Usage is the Overall limit's; null for PerClient, or when no config is
	// stored or assumed.
	Usage *limitUsage `json:"usage"`
	// Clients are the PerClient clients, with their usage when a config is
	// stored or assumed.
	Clients []limitUsage `json:"clients"`
	// Shadow: the stored config is in shadow mode (redlimit shadow,
	// Limiter.SetShadow): every decision is made and counted, and every
	// request granted. A handle's own WithShadow is the services', not
	// Redis's; without a stored config there is none to keep it.
	Shadow bool `json:"shadow"`
	// Held is what Redis holds when no config is stored, in the state's own
	// terms (counts, times, records): what needs no rate. Absent when a
	// config is stored.
	Held *heldJSON `json:"held,omitempty"`
	// Reservations are the request log's open entries: reservations not
	// yet released or settled (reservations.go). Absent for an in-flight
	// limit.
	Reservations *reservationsJSON `json:"reservations,omitempty"`
	// Degraded is degraded mode's word on the limiter: the instances live
	// and the share each decides on in an outage (instances.go). Absent
	// when degraded mode is off under the prefix.
	Degraded *degradedJSON `json:"degraded,omitempty"`
}

// getUnknown is get on a name whose keys tell no algorithm: it says what
// they hold, or, when it has none, that there is no limiter (exit 3): an
// idle limiter on a default has no key, as a name never used has none.
func (a *admin) getUnknown(ctx context.Context, name string, at *instant) int {
	full := a.client.TokenBucket(name).Name()
	held, err := a.readHeld(ctx, full, nil, at.t)
	if err != nil {
		return a.fail(err)
	}
	if len(held.Keys) == 0 {
		fmt.Fprintf(a.stderr, "redlimit get: no limiter %q in %v (no key %s, nor any other of its keys): %s\n", name, &a.be, full, nothingHeld(name))
		return exitNotFound
	}
	rep := limiterReport{Name: name, Key: full, AsOf: at.t.UTC().Format(asOfLayout), Clients: []limitUsage{}, Held: held}
	if rep.Reservations, err = a.readReservations(ctx, full, at.t); err != nil {
		return a.fail(err)
	}
	for i, k := range held.Keys {
		if i == 0 || k.TTLMS < 0 || rep.TTLMS >= 0 && k.TTLMS > rep.TTLMS {
			rep.TTLMS = k.TTLMS
		}
	}
	if a.json {
		return a.writeJSON(rep)
	}
	rep.print(a.stdout)
	return exitOK
}

func get(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := newAdmin("get", "get [flags] NAME", `Shows a limiter: its algorithm, the stored config (or none: it runs on its
handles' default), its TTL, and its usage now: permits remaining, when the
next permit frees and when it is full again; for a PerClient limiter, each
client's; whether it is in shadow mode. It writes nothing: usage is read
with peeks (Allow with zero permits), the next permit's time with peeks
ahead of now. With --json, durations are in milliseconds from as_of (Redis
TIME): retry_after_ms is the wait for one permit, reset_after_ms until the
limiter is full again.

Without a stored config (a limiter on its handles' default), it shows what
Redis holds for it, key by key with their TTLs, in the state's own terms:
a funnel's TAT and debt, a window's start and count, a sliding window's
sub-windows, a token bucket's records, the registry's clients. Permits need
the services' default: give it with --rate and --per (and the other config
flags). A name with no key at all exits 3: nothing is held for it, which
is also what an idle limiter on a default looks like (it keeps state only
while it is in use).

Reservations (Reserve; a lease's block is one) open in the limiter's
request log are listed, soonest to expire first, each with the time left to
release or settle it (under WithRetryWindow the log also holds recent
grants' ids). While degraded mode is on under the prefix (redlimit
instances), a line says how many instances are live and the share of the
limit each decides on locally in an outage.

For an in-flight limit: its stored limit and TTL (or none), how many holds
are live, and each holder's id and time left until its hold expires unless
refreshed, by id (InFlight.Holders). The rate flags do not apply.

	redlimit get --redis redis://localhost:6379 --prefix svc: user:42
`, true, stdout, stderr)
	var assume configFlags
	assume.add(a.fs, " (the default to assume when none is stored)")
	pos, code, ok := a.parse(args)
	if !ok {
		return code
	}
	switch {
	case len(pos) != 1:
		return usageError(a.fs, "want one NAME, got %d arguments", len(pos))
	case assume.missing(a.fs) != "":
		return usageError(a.fs, "%s", assume.missing(a.fs))
	}
	if code := a.connect(ctx); code != exitOK {
		return code
	}
	defer a.close()
	at := &instant{}
	var err error
	if at.t, err = usageTime(ctx, a.rdb); err != nil {
		return a.fail(err)
	}
	a.client = redlimit.New(a.rdb, redlimit.WithPrefix(a.prefix), redlimit.WithClock(at.now))
	name := pos[0]
	found, err := a.locate(ctx, name)
	if err != nil {
		return a.fail(err)
	}
	if found.algorithm == "" {
		return a.getUnknown(ctx, name, at)
	}
	l, code := a.handle(name, found)
	if code != exitOK {
		return code
	}
	alg := found.algorithm
	if alg == inFlightAlgorithm {
		if flag := visited(a.fs, rateFlags...); flag != "" {
			return invalid(a.fs, "%s is an in-flight limit: --%s is a rate limiter's flag", name, flag)
		}
		return a.getInFlight(ctx, name, at)
	}
	rep := limiterReport{Name: name, Key: l.Name(), Algorithm: alg, AsOf: at.t.UTC().Format(asOfLayout), Clients: []limitUsage{}}
	cfg, err := l.Config(ctx)
	switch {
	case errors.Is(err, redlimit.ErrNotInitialized):
		if rep.Held, err = a.readHeld(ctx, l.Name(), wire.AlgorithmNamed(alg), at.t); err != nil {
			return a.fail(err)
		}
		if assume.given() {
			cfg = assume.config()
			if err := l.Validate(cfg); err != nil {
				return invalid(a.fs, "%v", err)
			}
			l, rep.Assumed = l.WithDefault(cfg), toJSON(cfg)
		}
	case err != nil:
		return a.fail(err)
	default:
		rep.Config, rep.Shadow = toJSON(cfg), found.shadow
	}
	ttl, err := l.RemainTimeToLive(ctx)
	if err != nil {
		return a.fail(err)
	}
	rep.TTLMS = int64(ttl)
	if ttl >= 0 {
		rep.TTLMS = ms(ttl)
	}
	known := rep.Config != nil || rep.Assumed != nil
	if known && cfg.Type == redlimit.Overall {
		u, err := peek(ctx, l, "", at)
		if err != nil {
			return a.fail(err)
		}
		rep.Usage = &u
	}
	if !known || cfg.Type == redlimit.PerClient {
		ids, err := l.Clients(ctx)
		if err != nil {
			return a.fail(err)
		}
		slices.Sort(ids)
		for _, id := range ids {
			u := limitUsage{Client: id, RetryAfterMS: -1, ResetAfterMS: -1, Limit: -1, Remaining: -1}
			if known {
				if u, err = peek(ctx, l.AsClient(id), id, at); err != nil {
					return a.fail(err)
				}
			}
			rep.Clients = append(rep.Clients, u)
		}
	}
	if rep.Reservations, err = a.readReservations(ctx, l.Name(), at.t); err != nil {
		return a.fail(err)
	}
	in, err := a.readInstances(ctx, at.t)
	if err != nil {
		return a.fail(err)
	}
	if known {
		rep.Degraded = degradedShare(in, &cfg)
	} else {
		rep.Degraded = degradedShare(in, nil)
	}
	if a.json {
		return a.writeJSON(rep)
	}
	rep.print(stdout)
	return exitOK
}

// asOfLayout is RFC 3339 to the millisecond, the precision of the numbers.
const asOfLayout = "2006-01-02T15:04:05.000Z07:00"

func (a *admin) writeJSON(v any) int {
	if err := json.NewEncoder(a.stdout).Encode(v); err != nil {
		return a.fail(err)
	}
	return exitOK
}

func (r limiterReport) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "limiter\t%s\t(key %s)\n", r.Name, r.Key)
	if r.Algorithm != "" {
		fmt.Fprintf(tw, "algorithm\t%s\n", r.Algorithm)
	} else {
		fmt.Fprintf(tw, "algorithm\tunknown (no config, and no state tells it)\n")
	}
	switch {
	case r.Config != nil:
		fmt.Fprintf(tw, "config\t%s\t(stored)\n", fromJSON(r.Config))
		if r.Shadow {
			fmt.Fprintf(tw, "shadow\ton: every decision counted, every request granted (redlimit shadow %s off to enforce)\n", r.Name)
		} else {
			fmt.Fprintf(tw, "shadow\toff\n")
		}
	case r.Assumed != nil:
		fmt.Fprintf(tw, "config\tnone stored; assuming %s\t(--rate, --per)\n", fromJSON(r.Assumed))
	default:
		fmt.Fprintf(tw, "config\tnone stored\t(it runs on its handles' default: what Redis holds follows; --rate and --per give permits)\n")
	}
	switch {
	case r.TTLMS == int64(redlimit.NoExpiry):
		fmt.Fprintf(tw, "expires\tnever\n")
	case r.TTLMS == int64(redlimit.NoKey):
		fmt.Fprintf(tw, "expires\tno key\n") // gone between locate and now
	default:
		fmt.Fprintf(tw, "expires\tin %v\n", time.Duration(r.TTLMS)*time.Millisecond)
	}
	if r.Usage != nil {
		fmt.Fprintf(tw, "remaining\t%s%s\n", r.Usage, r.binds(*r.Usage))
	}
	if line := r.Reservations.line(); line != "" {
		fmt.Fprintf(tw, "reserved\t%s\n", line)
	}
	if r.Degraded != nil {
		fmt.Fprintf(tw, "degraded\t%s\n", r.Degraded)
	}
	tw.Flush()
	defer r.Reservations.print(w) // last: after the clients, or what Redis holds
	if r.Held != nil {
		asOf, _ := time.Parse(asOfLayout, r.AsOf)
		defer r.Held.print(w, r.Name, asOf)
	}
	// Without a config, the clients' state is in Held.
	if (r.Config != nil || r.Assumed != nil) && (r.Usage == nil || len(r.Clients) > 0) {
		if len(r.Clients) == 0 {
			fmt.Fprintf(w, "\nNo client has usage (PerClient): every one has its full limit.\n")
			return
		}
		fmt.Fprintf(w, "\n%d clients (PerClient):\n", len(r.Clients))
		for _, c := range r.Clients {
			fmt.Fprintf(tw, "  %s\t%s%s\n", c.Client, c, r.binds(c))
		}
		tw.Flush()
	}
}

// binds names the rate u's numbers are of, when the config has several.
func (r limiterReport) binds(u limitUsage) string {
	c := r.Config
	if c == nil {
		c = r.Assumed
	}
	if c == nil || len(c.More) == 0 || u.full() || u.Bound < 0 || u.Bound > len(c.More) {
		return ""
	}
	cfg := fromJSON(c)
	bound := redlimit.Config{Rate: cfg.Rate, Interval: cfg.Interval, Burst: cfg.Burst, Buckets: cfg.Buckets, Calendar: cfg.Calendar}
	if u.Bound > 0 {
		bound = cfg.More[u.Bound-1]
	}
	return fmt.Sprintf("; %v binds", bound)
}

// full: with several rates, one can have all its permits while another
// counts usage; the limiter is full only once nothing is left to reset.
func (u limitUsage) full() bool { return u.Remaining == u.Limit && u.ResetAfterMS == 0 }

func (u limitUsage) String() string {
	reset := time.Duration(u.ResetAfterMS) * time.Millisecond
	if u.full() {
		return fmt.Sprintf("%d of %d; full", u.Remaining, u.Limit)
	}
	next := "a permit is free now"
	if u.RetryAfterMS > 0 {
		next = fmt.Sprintf("next permit in %v", time.Duration(u.RetryAfterMS)*time.Millisecond)
	}
	return fmt.Sprintf("%d of %d; %s; full again in %v", u.Remaining, u.Limit, next, reset)
}

func fromJSON(c *configJSON) redlimit.Config {
	cfg := redlimit.Config{Rate: c.Rate, Interval: time.Duration(c.IntervalMS) * time.Millisecond,
		Burst: c.Burst, Buckets: c.Buckets, KeepAlive: time.Duration(c.KeepAliveMS) * time.Millisecond, Calendar: c.Calendar}
	if c.Type == redlimit.PerClient.String() {
		cfg.Type = redlimit.PerClient
	}
	for _, r := range c.More {
		cfg.More = append(cfg.More, redlimit.Config{Rate: r.Rate, Interval: time.Duration(r.IntervalMS) * time.Millisecond, Burst: r.Burst, Buckets: r.Buckets, Calendar: r.Calendar})
	}
	return cfg
}

func set(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := newAdmin("set", "set NAME (--rate N --per DURATION | --limit N --ttl DURATION) [flags]", `Stores a limiter's config (SetRate), or with --if-absent only when none is
stored (TrySetRate). Usage so far is kept and counts against the new rate;
changing --per-client clears it. A limiter that exists keeps its algorithm;
a new one needs --algorithm: the one its services' handles use.

With --limit and --ttl instead, it stores an in-flight limit's config
(InFlight.SetLimit; TrySetLimit with --if-absent): at most --limit holds at
once, each lost --ttl after it was taken or last refreshed. Holds are kept:
with a lower limit, those above it finish, and none is granted until fewer
remain. The rate flags do not go with these.

	redlimit set --redis redis://localhost:6379 user:42 --rate 100 --per 1m --algorithm fixed_window
	redlimit set --redis redis://localhost:6379 exports --limit 10 --ttl 30s
`, false, stdout, stderr)
	var c configFlags
	c.add(a.fs, "")
	var hold inFlightFlags
	hold.add(a.fs)
	algorithm := a.fs.String("algorithm", "", "for a new limiter: "+strings.Join(algorithmNames(), ", ")+" (--limit and --ttl need none: they say "+inFlightAlgorithm+")")
	ifAbsent := a.fs.Bool("if-absent", false, "store only if no config is stored (TrySetRate, TrySetLimit)")
	pos, code, ok := a.parse(args)
	if !ok {
		return code
	}
	rate, inFlight := visited(a.fs, rateFlags...), visited(a.fs, inFlightFlagNames...)
	switch {
	case len(pos) != 1:
		return usageError(a.fs, "want one NAME, got %d arguments", len(pos))
	case *algorithm != "" && *algorithm != inFlightAlgorithm && algorithmNamed(*algorithm) == nil:
		return invalid(a.fs, "unknown algorithm %q: want one of %s, %s", *algorithm, strings.Join(algorithmNames(), ", "), inFlightAlgorithm)
	case rate != "" && inFlight != "":
		return usageError(a.fs, "--%s is an in-flight limit's, --%s a rate limiter's: give one or the other", inFlight, rate)
	case *algorithm == inFlightAlgorithm && rate != "":
		return usageError(a.fs, "--algorithm %s takes --limit and --ttl, not --%s", inFlightAlgorithm, rate)
	case inFlight != "" && *algorithm != "" && *algorithm != inFlightAlgorithm:
		return usageError(a.fs, "--%s is an in-flight limit's: --algorithm %s takes --rate and --per", inFlight, *algorithm)
	case inFlight != "" || *algorithm == inFlightAlgorithm:
		return a.setInFlight(ctx, pos[0], hold, *ifAbsent)
	case !c.given():
		return usageError(a.fs, "want --rate and --per, or --limit and --ttl")
	case c.missing(a.fs) != "":
		return usageError(a.fs, "%s", c.missing(a.fs))
	}
	// Ranges before dialling; the fields an algorithm uses once it is known.
	common := c.config()
	for i := range common.More {
		common.More[i].Burst, common.More[i].Buckets, common.More[i].Calendar = 0, 0, redlimit.Calendar{}
	}
	common.Burst, common.Buckets, common.Calendar = 0, 0, redlimit.Calendar{}
	if err := redlimit.New(nil).TokenBucket(pos[0]).Validate(common); err != nil {
		return invalid(a.fs, "%v", err)
	}
	if code := a.connect(ctx); code != exitOK {
		return code
	}
	defer a.close()
	name := pos[0]
	at, err := a.locate(ctx, name)
	switch held := at.algorithm; {
	case err != nil:
		return a.fail(err)
	case held == inFlightAlgorithm:
		return a.fail(fmt.Errorf("%s is an in-flight limit, not a rate limiter: set it with --limit and --ttl, or delete it first (redlimit delete) to make it a rate limiter", name))
	case held == "" && *algorithm == "":
		// Guessing would break the services: a handle of another
		// algorithm fails on a config that is not its own.
		return invalid(a.fs, "%s is not in Redis yet: give the --algorithm its services use", name)
	case held != "" && *algorithm != "" && held != *algorithm:
		return a.fail(fmt.Errorf("%s is a %s limiter, not a %s: delete it first (redlimit delete) to change its algorithm", name, held, *algorithm))
	case held != "":
		*algorithm = held
	}
	l := algorithmNamed(*algorithm)(a.client, name)
	cfg := c.config()
	if err := l.Validate(cfg); err != nil {
		return invalid(a.fs, "%v", err)
	}
	if *ifAbsent {
		stored, err := l.TrySetRate(ctx, cfg)
		if err != nil {
			return a.fail(err)
		}
		if !stored {
			now, err := l.Config(ctx)
			if err != nil {
				return a.fail(err)
			}
			fmt.Fprintf(stdout, "%s: %s keeps the config stored already: %v\n", name, *algorithm, now)
			return exitOK
		}
	} else if err := l.SetRate(ctx, cfg); err != nil {
		return a.fail(err)
	}
	fmt.Fprintf(stdout, "%s: %s now %v\n", name, *algorithm, cfg)
	return exitOK
}

func reset(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := newAdmin("reset", "reset [flags] NAME", `Forgets a limiter's usage, every client's, and keeps its config (Reset).
For an in-flight limit, drops every hold and keeps its config
(InFlight.Reset): holders still at work find their hold lost on their next
refresh, and their slots serve others at once.
`, false, stdout, stderr)
	return a.onLimiter(ctx, args, 0, func(l *redlimit.Limiter, name, _ string) int {
		if err := l.Reset(ctx); err != nil {
			return a.fail(err)
		}
		fmt.Fprintf(stdout, "%s: usage forgotten\n", name)
		return exitOK
	}, func(f *redlimit.InFlight, name string) int {
		held, err := f.Reset(ctx)
		if err != nil {
			return a.fail(err)
		}
		if held {
			fmt.Fprintf(stdout, "%s: every hold dropped\n", name)
		} else {
			fmt.Fprintf(stdout, "%s: no hold to drop\n", name)
		}
		return exitOK
	})
}

// terminalInput is where delete reads a confirmation from, and whether it
// is a terminal; a variable so that tests can answer.
var terminalInput = func() (io.Reader, bool) {
	fi, err := os.Stdin.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return os.Stdin, false
	}
	// /dev/null is a character device too: daemons and CI run with it.
	null, err := os.Stat(os.DevNull)
	return os.Stdin, err != nil || !os.SameFile(fi, null)
}

func deleteLimiter(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := newAdmin("delete", "delete [flags] NAME", `Removes every key of a limiter: its config, every client's usage (Delete).
Services with a default carry on from a full limit; those without fail with
"rate not set" until a rate is stored again. For an in-flight limit, its
config and every hold (InFlight.Delete): holders still at work are not told,
and find their hold gone at their next refresh (Hold.Lost). Asks for
confirmation on a terminal; elsewhere it needs --yes.
`, false, stdout, stderr)
	yes := a.fs.Bool("yes", false, "delete without asking")
	// confirmed asks on a terminal, unless --yes; when not confirmed, it
	// says what run should return.
	confirmed := func(question string) (int, bool) {
		if *yes {
			return exitOK, true
		}
		in, terminal := terminalInput()
		if !terminal {
			return invalid(a.fs, "not a terminal: confirm with --yes"), false
		}
		fmt.Fprintf(stdout, "%s [y/N] ", question)
		line, _ := bufio.NewReader(in).ReadString('\n')
		if answer := strings.ToLower(strings.TrimSpace(line)); answer != "y" && answer != "yes" {
			fmt.Fprintln(stdout, "Nothing deleted.")
			return exitFail, false
		}
		return exitOK, true
	}
	deleted := func(name string, existed bool, err error) int {
		switch {
		case err != nil:
			return a.fail(err)
		case !existed: // gone since locate found it
			return a.notFound(name)
		}
		fmt.Fprintf(stdout, "%s: deleted\n", name)
		return exitOK
	}
	return a.onLimiter(ctx, args, 0, func(l *redlimit.Limiter, name, alg string) int {
		if code, ok := confirmed(fmt.Sprintf("Delete the %s limiter %s (key %s) and all its usage?", alg, name, l.Name())); !ok {
			return code
		}
		existed, err := l.Delete(ctx)
		return deleted(name, existed, err)
	}, func(f *redlimit.InFlight, name string) int {
		if code, ok := confirmed(fmt.Sprintf("Delete the in-flight limit %s (key %s) and all its holds?", name, f.Name())); !ok {
			return code
		}
		existed, err := f.Delete(ctx)
		return deleted(name, existed, err)
	})
}

func expire(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := newAdmin("expire", "expire [flags] NAME DURATION", `Makes every key of a limiter expire within DURATION (a Go duration such as
10m, or whole seconds); keys due sooner keep their expiry (Expire). A later
SetRate or keep-alive sets the expiry again. Not for an in-flight limit: its
config never expires, and each hold expires by itself.
`, false, stdout, stderr)
	var ttl time.Duration
	return a.onLimiter(ctx, args, 1, func(l *redlimit.Limiter, name, _ string) int {
		existed, err := l.Expire(ctx, ttl)
		if err != nil {
			return a.fail(err)
		}
		if !existed {
			return a.notFound(name)
		}
		fmt.Fprintf(stdout, "%s: expires within %v\n", name, ttl)
		return exitOK
	}, a.notForInFlight("the config never expires, and each hold expires by itself, TTL after it was taken or last refreshed"), func(arg string) int {
		d, err := parsePeriod(arg)
		switch {
		case err != nil:
			return invalid(a.fs, "DURATION %q: %v", arg, err)
		case d <= 0:
			// Expire deletes on zero; deleting is delete's job, with its confirmation.
			return invalid(a.fs, "DURATION %v: want more than 0 (to delete, use redlimit delete)", d)
		}
		ttl = d
		return exitOK
	})
}

func shadow(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := newAdmin("shadow", "shadow [flags] NAME on|off", `Turns shadow mode on or off for every instance's handles on a limiter
(SetShadow), from their next decision. On, each decision is made and
counted in Redis as ever, and every request is granted: Result says what
enforcing would have answered (Shadow, Reason). For trying a new limit on
live traffic before it may deny anything. Off, the limit is enforced again.

Shadow mode is kept with the stored config: it survives set and reset;
delete, or the config's expiry, ends it. A limiter running on its handles'
default has no config in Redis to keep it (exit 1): store one first
(redlimit set), or give the services' handles WithShadow. get and ls show
it. Not for an in-flight limit (exit 1).

	redlimit shadow --redis redis://localhost:6379 --prefix svc: user:42 on
`, false, stdout, stderr)
	var on bool
	return a.onLimiter(ctx, args, 1, func(l *redlimit.Limiter, name, _ string) int {
		err := l.SetShadow(ctx, on)
		switch {
		case errors.Is(err, redlimit.ErrNotInitialized):
			fmt.Fprintf(a.stderr, "redlimit shadow: %s runs on its handles' default, with no config stored, and shadow mode is kept with a stored config: "+
				"store one first (redlimit set %s --rate N --per D), or give the services' handles WithShadow\n", name, name)
			return exitFail
		case err != nil:
			return a.fail(err)
		case on:
			fmt.Fprintf(stdout, "%s: shadow mode on: every decision counted, every request granted\n", name)
		default:
			fmt.Fprintf(stdout, "%s: shadow mode off: the limit is enforced\n", name)
		}
		return exitOK
	}, a.notForInFlight("an in-flight limit has no shadow mode"), func(arg string) int {
		switch arg {
		case "on", "off":
			on = arg == "on"
			return exitOK
		}
		return usageError(a.fs, "want on or off, got %q", arg)
	})
}

// onLimiter parses NAME and extra arguments (each checked by its own
// func), connects, finds the limiter and runs do on it, or inFlight on an
// in-flight limit.
func (a *admin) onLimiter(ctx context.Context, args []string, extra int, do func(l *redlimit.Limiter, name, alg string) int,
	inFlight func(f *redlimit.InFlight, name string) int, checks ...func(string) int) int {
	pos, code, ok := a.parse(args)
	if !ok {
		return code
	}
	if len(pos) != 1+extra {
		return usageError(a.fs, "want %d arguments, got %d", 1+extra, len(pos))
	}
	for i, check := range checks {
		if code := check(pos[1+i]); code != exitOK {
			return code
		}
	}
	if code := a.connect(ctx); code != exitOK {
		return code
	}
	defer a.close()
	l, at, code := a.limiter(ctx, pos[0])
	switch {
	case code != exitOK:
		return code
	case at.algorithm == inFlightAlgorithm:
		return inFlight(a.client.InFlight(pos[0]), pos[0])
	}
	return do(l, pos[0], at.algorithm)
}

// notForInFlight is the inFlight of a command an in-flight limit does not
// take: it refuses, saying why.
func (a *admin) notForInFlight(why string) func(*redlimit.InFlight, string) int {
	return func(_ *redlimit.InFlight, name string) int {
		fmt.Fprintf(a.stderr, "redlimit %s: %s is an in-flight limit: %s is not supported for in-flight limits (%s)\n", a.name, name, a.name, why)
		return exitFail
	}
}
