package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/wire"
)

// In-flight limits (redlimit.InFlight) in the admin commands: at most Limit
// holds at once, each lost TTL after it was taken or last refreshed. Their
// keys are the config hash (limit, ttl in ms, algorithm = inflight) and the
// holds, a sorted set at {name}:holders; every read and write here goes
// through the library, but ls's reading of the hash.

// inFlightAlgorithm is the algorithm field of an in-flight limit's hash.
const inFlightAlgorithm = wire.InFlightAlgorithm

// inFlightFlags are set's flags for an in-flight limit.
type inFlightFlags struct {
	limit int64
	ttl   time.Duration
}

// inFlightFlagNames are inFlightFlags' names: none a rate limiter's.
var inFlightFlagNames = []string{"limit", "ttl"}

func (f *inFlightFlags) add(fs *flag.FlagSet) {
	fs.Int64Var(&f.limit, "limit", 0, "an in-flight limit: holds at once (InFlightConfig.Limit)")
	fs.DurationVar(&f.ttl, "ttl", 0, "an in-flight limit: how long a hold lasts unless refreshed, e.g. 30s (InFlightConfig.TTL)")
}

// inFlightJSON is an in-flight limit's config for scripts.
type inFlightJSON struct {
	Limit int64 `json:"limit"`
	TTLMS int64 `json:"ttl_ms"`
}

func toInFlightJSON(cfg redlimit.InFlightConfig) *inFlightJSON {
	return &inFlightJSON{Limit: cfg.Limit, TTLMS: cfg.TTL.Milliseconds()}
}

// String is the config as ls, get and set print it: "10 in flight, TTL 30s".
func (c *inFlightJSON) String() string {
	return fmt.Sprintf("%d in flight, TTL %v", c.Limit, time.Duration(c.TTLMS)*time.Millisecond)
}

// setInFlight is set with --limit and --ttl: SetLimit, or TrySetLimit.
func (a *admin) setInFlight(ctx context.Context, name string, flags inFlightFlags, ifAbsent bool) int {
	limit, ttl := visited(a.fs, "limit") != "", visited(a.fs, "ttl") != ""
	switch {
	case !limit && !ttl:
		return usageError(a.fs, "want --limit and --ttl")
	case !ttl:
		return usageError(a.fs, "--ttl is required with --limit")
	case !limit:
		return usageError(a.fs, "--limit is required with --ttl")
	}
	cfg := redlimit.InFlightConfig{Limit: flags.limit, TTL: flags.ttl}
	if err := redlimit.New(nil).InFlight(name).Validate(cfg); err != nil {
		return invalid(a.fs, "%v", err)
	}
	if code := a.connect(ctx); code != exitOK {
		return code
	}
	defer a.close()
	at, err := a.locate(ctx, name)
	switch held := at.algorithm; {
	case err != nil:
		return a.fail(err)
	case held != "" && held != inFlightAlgorithm:
		return a.fail(fmt.Errorf("%s is a %s limiter, not an in-flight limit: delete it first (redlimit delete) to make it one", name, held))
	}
	f := a.client.InFlight(name)
	if ifAbsent {
		stored, err := f.TrySetLimit(ctx, cfg)
		if err != nil {
			return a.fail(err)
		}
		if !stored {
			now, err := f.Config(ctx)
			if err != nil {
				return a.fail(err)
			}
			fmt.Fprintf(a.stdout, "%s: %s keeps the config stored already: %v\n", name, inFlightAlgorithm, toInFlightJSON(now))
			return exitOK
		}
	} else if err := f.SetLimit(ctx, cfg); err != nil {
		return a.fail(err)
	}
	fmt.Fprintf(a.stdout, "%s: %s now %v\n", name, inFlightAlgorithm, toInFlightJSON(cfg))
	return exitOK
}

// inFlightReport is get's answer for an in-flight limit.
type inFlightReport struct {
	Name      string `json:"name"`
	Key       string `json:"key"`
	Algorithm string `json:"algorithm"` // inflight
	// InFlight is the stored config; null when the limit runs on its
	// handles' default, which lives in the services, not in Redis.
	InFlight *inFlightJSON `json:"inflight"`
	// AsOf is the instant the holds' time left is counted from (Redis
	// TIME, to the ms).
	AsOf    string       `json:"as_of"`
	Held    int          `json:"held"`    // live holds
	Holders []holderJSON `json:"holders"` // the live holds, by id
}

// holderJSON is one live hold: its id (the holding Client's ID, ':', then
// random hex) and the time until it expires unless refreshed.
type holderJSON struct {
	ID    string `json:"id"`
	TTLMS int64  `json:"ttl_ms"`
}

// getInFlight is get on an in-flight limit. a.client decides on the clock
// at, so that every hold's time left is of that one instant.
func (a *admin) getInFlight(ctx context.Context, name string, at *instant) int {
	f := a.client.InFlight(name)
	rep := inFlightReport{Name: name, Key: f.Name(), Algorithm: inFlightAlgorithm, AsOf: at.t.UTC().Format(asOfLayout), Holders: []holderJSON{}}
	cfg, err := f.Config(ctx)
	switch {
	case errors.Is(err, redlimit.ErrNotInitialized):
	case err != nil:
		return a.fail(err)
	default:
		rep.InFlight = toInFlightJSON(cfg)
	}
	holders, err := f.Holders(ctx)
	if err != nil {
		return a.fail(err)
	}
	// By id, not by expiry: the order stays put while holds refresh, and
	// one instance's holds (their ids start with its client ID) stay together.
	slices.SortFunc(holders, func(x, y redlimit.Holder) int { return strings.Compare(x.ID, y.ID) })
	for _, h := range holders {
		rep.Holders = append(rep.Holders, holderJSON{ID: h.ID, TTLMS: ms(h.TTL)})
	}
	rep.Held = len(holders)
	if a.json {
		return a.writeJSON(rep)
	}
	rep.print(a.stdout)
	return exitOK
}

func (r inFlightReport) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "limiter\t%s\t(key %s)\n", r.Name, r.Key)
	fmt.Fprintf(tw, "algorithm\t%s\n", r.Algorithm)
	if r.InFlight != nil {
		fmt.Fprintf(tw, "config\t%s\t(stored)\n", r.InFlight)
	} else {
		fmt.Fprintf(tw, "config\tnone stored\t(it runs on its handles' default)\n")
	}
	fmt.Fprintf(tw, "held\t%s\n", heldOf(r.Held, r.InFlight))
	tw.Flush()
	if len(r.Holders) == 0 {
		return
	}
	holders := "holders"
	if len(r.Holders) == 1 {
		holders = "holder"
	}
	fmt.Fprintf(w, "\n%d %s, by id:\n", len(r.Holders), holders)
	for _, h := range r.Holders {
		fmt.Fprintf(tw, "  %s\t%v left\n", h.ID, time.Duration(h.TTLMS)*time.Millisecond)
	}
	tw.Flush()
}

// heldOf says how many holds are live, of how many when the config is known.
// A lowered limit can have more held than it allows: they finish, and no
// new one is granted until fewer remain.
func heldOf(held int, cfg *inFlightJSON) string {
	switch {
	case cfg == nil:
		return strconv.Itoa(held)
	case int64(held) < cfg.Limit:
		return fmt.Sprintf("%d of %d; %d free", held, cfg.Limit, cfg.Limit-int64(held))
	}
	return fmt.Sprintf("%d of %d; none free", held, cfg.Limit)
}

// storedInFlight reads an in-flight limit's config from its hash's fields,
// as scripts/inflight.lua checks them before every call: both present,
// whole numbers, within the library's bounds.
func storedInFlight(h hashFields, name string) (*inFlightJSON, error) {
	var n [2]int64
	for i, field := range []string{wire.FieldLimit, wire.FieldTTL} {
		s, ok := h[field]
		if !ok {
			return nil, fmt.Errorf("field %s missing", field)
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("field %s = %q", field, s)
		}
		n[i] = v
	}
	cfg := redlimit.InFlightConfig{Limit: n[0], TTL: time.Duration(n[1]) * time.Millisecond}
	if err := redlimit.New(nil).InFlight(name).Validate(cfg); err != nil {
		return nil, fmt.Errorf("fields %s = %d, %s = %d: %s", wire.FieldLimit, n[0], wire.FieldTTL, n[1], strings.TrimPrefix(err.Error(), "redlimit: "))
	}
	return toInFlightJSON(cfg), nil
}
