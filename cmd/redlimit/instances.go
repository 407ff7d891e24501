package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/local"
	"github.com/redlimit/redlimit/internal/wire"
)

// Degraded mode (redlimit.WithDegraded) as Redis shows it: every Client
// with it beats into its prefix's heartbeat key (wire.HeartbeatKey), a zset
// of its instances scored by their last beat (ms), which each beat renews
// for the beater's Expire and clears of the instances not heard from within
// it. Each instance learns there how many are live, and divides a limit by
// that many while Redis is down. Reads ZRANGE and PTTL only.

// instancesReport is what the heartbeat key says: instances's answer, and
// get's degraded line.
type instancesReport struct {
	Key  string `json:"key"`
	AsOf string `json:"as_of"` // Redis TIME, to the ms: the instant of the ages
	// On: the key exists. It does while some Client under the prefix runs
	// WithDegraded and has beaten within its Expire.
	On bool `json:"on"`
	// TTLMS is the key's PTTL: the Expire of the latest beat, less its age.
	TTLMS int64 `json:"ttl_ms"`
	// ExpireMS is how long an instance counts after its last beat, as the
	// latest beat set it: the key's TTL plus that beat's age (the beats'
	// clocks apart move it); 0 when off, or when the key does not expire
	// (made so by hand: each beat renews it).
	ExpireMS int64 `json:"expire_ms"`
	// Live is how many instances a beat now would count: those heard from
	// within ExpireMS. A share of a limit L is ⌈L / Live⌉ for each.
	Live int `json:"live"`
	// Instances are the key's members, by client id and tag.
	Instances []instanceJSON `json:"instances"`
	// Corrupt says why the key is not a heartbeat's.
	Corrupt string `json:"corrupt,omitempty"`
}

// instanceJSON is one instance: a member of the heartbeat key.
type instanceJSON struct {
	ClientID string `json:"client_id"` // its Client's WithClientID (or random id)
	Tag      string `json:"tag"`       // the instance's own, 16 hex digits
	// Member is the member as it is, when it is not of an instance's
	// shape (wire.ParseHeartbeatMember): counted by the beats all the same.
	Member     string `json:"member,omitempty"`
	LastBeatMS int64  `json:"last_beat_ms"` // ms since the epoch, on the beater's clock
	AgeMS      int64  `json:"age_ms"`       // since the last beat, as of as_of
	// Live: heard from within expire_ms. One that is not is counted by no
	// beat, and the next beat drops it.
	Live bool `json:"live"`
	// SameID is how many live instances have this one's client id, itself
	// included: a PerClient limit's divisor on it. 0 when not live.
	SameID int `json:"same_id"`
}

// readInstances reads the heartbeat key of a's prefix as of now.
func (a *admin) readInstances(ctx context.Context, now time.Time) (*instancesReport, error) {
	rep := &instancesReport{Key: wire.HeartbeatKey(a.prefix), AsOf: now.UTC().Format(asOfLayout), Instances: []instanceJSON{}}
	pipe := a.rdb.Pipeline()
	members := pipe.ZRangeWithScores(ctx, rep.Key, 0, -1)
	ttl := pipe.PTTL(ctx, rep.Key)
	if _, err := pipe.Exec(ctx); err != nil && !isWrongType(err) {
		return nil, fmt.Errorf("reading %s: %w", rep.Key, err)
	}
	switch {
	case isWrongType(members.Err()):
		rep.On, rep.TTLMS = true, ttlMS(ttl.Val())
		rep.Corrupt = "a " + a.rdb.Type(ctx, rep.Key).Val() + ", not a zset of instances"
		return rep, nil
	case len(members.Val()) == 0: // no key: a zset is never empty
		return rep, nil
	}
	rep.On, rep.TTLMS = true, ttlMS(ttl.Val())
	nowMS, newest := now.UnixMilli(), int64(0)
	for _, z := range members.Val() {
		m, _ := z.Member.(string)
		in := instanceJSON{LastBeatMS: int64(z.Score)}
		in.AgeMS = max(0, nowMS-in.LastBeatMS)
		var ok bool
		if in.ClientID, in.Tag, ok = wire.ParseHeartbeatMember(m); !ok {
			in.Member = m
		}
		newest = max(newest, in.LastBeatMS)
		rep.Instances = append(rep.Instances, in)
	}
	if rep.TTLMS >= 0 {
		// So the newest beat is always live, and Live at least 1.
		rep.ExpireMS = rep.TTLMS + max(0, nowMS-newest)
	}
	same := map[string]int{}
	for i := range rep.Instances {
		in := &rep.Instances[i]
		// As the script clears it: a member older than now − expire goes.
		// A key made to never expire (PERSIST) tells no expire: every
		// member counts until the next beat renews it.
		in.Live = rep.TTLMS < 0 || in.AgeMS <= rep.ExpireMS
		if in.Live {
			rep.Live++
			same[in.ClientID]++
		}
	}
	for i := range rep.Instances {
		if in := &rep.Instances[i]; in.Live {
			in.SameID = same[in.ClientID]
		}
	}
	slices.SortFunc(rep.Instances, func(x, y instanceJSON) int {
		return strings.Compare(x.ClientID+"\x00"+x.Tag+x.Member, y.ClientID+"\x00"+y.Tag+y.Member)
	})
	return rep, nil
}

func instances(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := newAdmin("instances", "instances [flags]", `Shows degraded mode (redlimit.WithDegraded) under a prefix, as its heartbeat
key <prefix>redlimit:instances holds it: whether it is on (the key exists:
some Client under the prefix runs WithDegraded and has beaten within its
Expire), each instance (its client id, its own tag, the age of its last
beat), and how many are live: heard from within Expire, which the command
reads off the key (its TTL plus the latest beat's age). While Redis is
unavailable each instance decides locally within its share of a limit L,
⌈L / N⌉, N being the most instances its beats counted within Expire: the
live ones, or more for up to Expire after instances left. A
PerClient limit is shared by the instances of one client id (same id).
It reads ZRANGE and PTTL, and writes nothing.

What each instance holds in memory (its hot leases, whether it decides
locally now) is not in Redis: see redlimitotel's HotLeaseMetrics and
DegradedMetrics.

	redlimit instances --redis redis://localhost:6379 --prefix svc:
`, true, stdout, stderr)
	pos, code, ok := a.parse(args)
	if !ok {
		return code
	}
	if len(pos) != 0 {
		return usageError(a.fs, "want no arguments, got %d", len(pos))
	}
	if code := a.connect(ctx); code != exitOK {
		return code
	}
	defer a.close()
	now, err := usageTime(ctx, a.rdb)
	if err != nil {
		return a.fail(err)
	}
	rep, err := a.readInstances(ctx, now)
	if err != nil {
		return a.fail(err)
	}
	if a.json {
		return a.writeJSON(rep)
	}
	rep.print(stdout)
	if rep.Corrupt != "" {
		return exitFail
	}
	return exitOK
}

// print writes the report for an operator.
func (r *instancesReport) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
	switch {
	case !r.On:
		fmt.Fprintf(tw, "degraded mode\toff\t(no key %s: no Client under this prefix runs WithDegraded, or none has beaten within its Expire)\n", r.Key)
		return
	case r.Corrupt != "":
		fmt.Fprintf(tw, "degraded mode\tunknown\t(key %s: %s)\n", r.Key, r.Corrupt)
		return
	case r.TTLMS < 0:
		fmt.Fprintf(tw, "degraded mode\ton\t(key %s, with no expiry: every instance counts until the next beat renews it)\n", r.Key)
	default:
		fmt.Fprintf(tw, "degraded mode\ton\t(key %s, expires in %v)\n", r.Key, ms(r.TTLMS))
		fmt.Fprintf(tw, "expire\t%v\t(an instance counts this long after its last beat: the key's TTL plus the latest beat's age)\n", ms(r.ExpireMS))
	}
	fmt.Fprintf(tw, "live\t%d\t(in an outage each instance decides locally within ⌈L/%d⌉ of a limit L)\n", r.Live, r.Live)
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintf(tw, "CLIENT ID\tINSTANCE\tLAST BEAT\tSAME ID\n")
	for _, in := range r.Instances {
		id, tag := in.ClientID, in.Tag
		if in.Member != "" {
			id, tag = fmt.Sprintf("%q", in.Member), "(not an instance's member)"
		}
		same := fmt.Sprint(in.SameID)
		if !in.Live {
			same = "stale: not counted; the next beat drops it"
		}
		fmt.Fprintf(tw, "%s\t%s\t%v ago\t%s\n", id, tag, ms(in.AgeMS), same)
	}
}

// degradedJSON is get's word on degraded mode for a limiter: how many
// instances are live, and the share each decides on in an outage.
type degradedJSON struct {
	Instances int `json:"instances"` // live, as redlimit instances counts them
	// Share is the config each instance decides on locally, each rate's
	// limit ⌈L / Instances⌉; null for a PerClient limit (shared by the
	// instances of one client id) or when no config is stored or assumed.
	Share *configJSON `json:"share"`

	perClient bool // the config is PerClient
}

// degradedShare is get's degraded report for a limiter of config cfg
// (nil: not known), or nil when degraded mode is off.
func degradedShare(in *instancesReport, cfg *redlimit.Config) *degradedJSON {
	if !in.On || in.Corrupt != "" {
		return nil
	}
	d := &degradedJSON{Instances: in.Live, perClient: cfg != nil && cfg.Type == redlimit.PerClient}
	if cfg == nil || d.perClient {
		return d
	}
	share := func(c *redlimit.Config) {
		c.Rate = local.Share(c.Rate, int64(in.Live))
		if c.Burst != 0 {
			c.Burst = local.Share(c.Burst, int64(in.Live))
		}
	}
	s := *cfg
	s.KeepAlive, s.More = 0, slices.Clone(cfg.More) // the config's life is Redis's, not the share's
	share(&s)
	for i := range s.More {
		share(&s.More[i])
	}
	d.Share = toJSON(s)
	return d
}

// String is get's degraded line.
func (d *degradedJSON) String() string {
	s := fmt.Sprintf("%d instances live (redlimit instances): in an outage each decides locally ", d.Instances)
	switch {
	case d.Share != nil:
		return s + "on " + fromJSON(d.Share).String()
	case d.perClient:
		return s + "its own client's limit L within ⌈L/n⌉, n the instances of its client id (SAME ID)"
	}
	return s + fmt.Sprintf("within ⌈L/%d⌉ of each limit L of its handles' default (--rate and --per give the share)", d.Instances)
}
