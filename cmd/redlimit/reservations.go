package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/wire"
)

// Reservations (Limiter.Reserve) as Redis shows them: each grant's id is an
// entry of the limiter's request log (wire.SuffixRequests), scored by when
// it expires (ms): until then it may be released or settled (SettleWithin,
// or as long as the grant counts), after which it is a charge of what it
// holds. A lease's block is one. The log drops an expired entry only as
// later requests come, so only the entries scored after now are open. What
// each holds is counted in the limiter's state (its usage) and known to its
// instance (Reservation.Taken), not to the log. Under WithRetryWindow the
// log also keeps every recent grant's id for the window, and Redis cannot
// tell those from reservations.

// reservationsListed is the most reservations get lists, soonest to expire
// first: a busy log under WithRetryWindow holds an id per grant.
const reservationsListed = 100

// reservationsJSON is get's report of a limiter's request log.
type reservationsJSON struct {
	Key  string `json:"key"`  // the request log
	Open int64  `json:"open"` // its entries not yet expired
	// Listed are the first of them (at most 100), soonest to expire first.
	Listed []reservationJSON `json:"listed"`
	// Corrupt says why the log could not be read.
	Corrupt string `json:"corrupt,omitempty"`
}

// reservationJSON is one open entry of the request log.
type reservationJSON struct {
	ID string `json:"id"`
	// TTLMS is the time left to release or settle it, as of as_of.
	TTLMS int64 `json:"ttl_ms"`
}

// openSince is the ZCOUNT or ZRANGEBYSCORE minimum of the entries open at
// now: scored after now's ms, as the decision script reads them.
func openSince(now time.Time) string { return "(" + strconv.FormatInt(now.UnixMilli(), 10) }

// readReservations reads the request log of the limiter key full as of now.
func (a *admin) readReservations(ctx context.Context, full string, now time.Time) (*reservationsJSON, error) {
	rep := &reservationsJSON{Key: wire.KeyOf(full, wire.SuffixRequests), Listed: []reservationJSON{}}
	pipe := a.rdb.Pipeline()
	open := pipe.ZCount(ctx, rep.Key, openSince(now), "+inf")
	listed := pipe.ZRangeByScoreWithScores(ctx, rep.Key, &redis.ZRangeBy{Min: openSince(now), Max: "+inf", Count: reservationsListed})
	if _, err := pipe.Exec(ctx); isWrongType(err) {
		rep.Corrupt = "a " + a.rdb.Type(ctx, rep.Key).Val() + ", not a zset of request ids"
		return rep, nil
	} else if err != nil {
		return nil, fmt.Errorf("reading %s: %w", rep.Key, err)
	}
	rep.Open = open.Val()
	for _, z := range listed.Val() {
		id, _ := z.Member.(string)
		rep.Listed = append(rep.Listed, reservationJSON{ID: id, TTLMS: int64(z.Score) - now.UnixMilli()})
	}
	return rep, nil
}

// line is get's reserved line: "" when the log has no open entry.
func (r *reservationsJSON) line() string {
	switch {
	case r == nil:
		return ""
	case r.Corrupt != "":
		return fmt.Sprintf("unknown: %s is %s", r.Key, r.Corrupt)
	case r.Open == 0:
		return ""
	}
	return fmt.Sprintf("%d open in %s (listed below)", r.Open, r.Key)
}

// print lists the open entries, soonest to expire first.
func (r *reservationsJSON) print(w io.Writer) {
	if r == nil || r.Open == 0 {
		return
	}
	fmt.Fprintf(w, "\nReserved, by time left to release or settle (the request log's ids: a lease's block is one; under WithRetryWindow, so is every recent grant):\n")
	for _, e := range r.Listed {
		fmt.Fprintf(w, "  %s  %v left\n", e.ID, time.Duration(e.TTLMS)*time.Millisecond)
	}
	if more := r.Open - int64(len(r.Listed)); more > 0 {
		fmt.Fprintf(w, "  … and %d more\n", more)
	}
}
