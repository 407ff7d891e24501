// Package heartbeat counts the live instances that share a Redis prefix,
// for degraded mode (the package redlimit's WithDegraded): each beats
// into one key of its prefix (wire.HeartbeatKey), a zset of the live
// instances scored by their last beat, through scripts/heartbeat.lua, and
// learns from the reply how many are live and how many share its client
// id. What it keeps is what an instance divides a limit by while Redis is
// unavailable, so a count falls only slowly (see Heart.Beat).
package heartbeat

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/wire"
)

// Config is one instance's heartbeat.
type Config struct {
	Every  time.Duration // how often it beats
	Expire time.Duration // how long an instance is counted after its last beat, and the key's TTL
	Key    string        // wire.HeartbeatKey
	Member string        // this instance in it: its client id, a space, 16 hex digits
	// ClientID is this instance's client id: the reply counts the members
	// that have it.
	ClientID string
	// Now is the Client's WithClock, or nil for Redis TIME.
	Now func() time.Time
	// Run runs the heartbeat script.
	Run func(ctx context.Context, keys, args []any) (any, error)
}

// Heart beats for one instance, and keeps what the beats counted.
type Heart struct {
	cfg Config
	// What the beats Redis answered counted (see Beat), and when the
	// latest was sent (ns).
	instances, same, beatAt atomic.Int64
	// The counts that instances and same keep, and when each was counted:
	// a lower count replaces one only after Expire.
	peakMu sync.Mutex
	peak   [2]int64
	peakAt [2]time.Time
	// first is closed once the first beat has returned.
	first chan struct{}
	stop  func() // ends the loop, once
}

// Start begins the heartbeat on a goroutine of its own, which beats at
// once, then every cfg.Every until Stop. It holds nothing but cfg, so that
// a Client's cleanup can stop it once the Client is unreachable.
func Start(cfg Config) *Heart {
	h := &Heart{cfg: cfg, first: make(chan struct{})}
	stop := make(chan struct{})
	h.stop = sync.OnceFunc(func() { close(stop) })
	go h.loop(stop)
	return h
}

// Stop ends the heartbeat; the instance drops out of the count once Expire
// passes without a beat.
func (h *Heart) Stop() { h.stop() }

// First is closed once the first beat has returned, answered or not.
func (h *Heart) First() <-chan struct{} { return h.first }

func (h *Heart) loop(stop <-chan struct{}) {
	tick := time.NewTicker(h.cfg.Every)
	defer tick.Stop()
	for first := true; ; first = false {
		ctx, cancel := context.WithTimeout(context.Background(), h.cfg.Every)
		_ = h.Beat(ctx) // a failure keeps what the last beat learnt: that is the point
		cancel()
		if first {
			close(h.first)
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// Beat runs the heartbeat script once and keeps what it counted. A count
// falls only once the higher one is Expire old: the members a Redis that
// lost its data (this key too) has not heard from again yet, or a beat
// that came late, still count.
func (h *Heart) Beat(ctx context.Context) error {
	now, sent := any(""), time.Now()
	if h.cfg.Now != nil {
		sent = h.cfg.Now()
		now = sent.UnixMilli()
	}
	args := make([]any, wire.HeartbeatClientID)
	args[wire.HeartbeatMember-1], args[wire.HeartbeatNow-1] = h.cfg.Member, now
	args[wire.HeartbeatExpire-1], args[wire.HeartbeatClientID-1] = h.cfg.Expire.Milliseconds(), h.cfg.ClientID
	reply, err := h.cfg.Run(ctx, []any{h.cfg.Key}, args)
	if err != nil {
		return err
	}
	var n [wire.HeartbeatReplyLen]int64
	v, ok := reply.([]any)
	ok = ok && len(v) == len(n)
	for i := 0; ok && i < len(n); i++ {
		n[i], ok = v[i].(int64)
	}
	if !ok || n[0] < 1 || n[1] < 1 || n[1] > n[0] {
		return wire.Unexpected(reply)
	}
	h.peakMu.Lock()
	for i, count := range n {
		if count >= h.peak[i] || sent.Sub(h.peakAt[i]) > h.cfg.Expire {
			h.peak[i], h.peakAt[i] = count, sent
		}
	}
	h.instances.Store(h.peak[0])
	h.same.Store(h.peak[1])
	h.peakMu.Unlock()
	h.beatAt.Store(sent.UnixNano())
	return nil
}

// Instances is the most instances the beats Redis answered counted live
// within Expire of the latest (this one included); 0 before the first.
func (h *Heart) Instances() int64 { return h.instances.Load() }

// Same is the same count of the instances with this one's client id.
func (h *Heart) Same() int64 { return h.same.Load() }

// BeatAt is when the latest beat Redis answered was sent, on the Client's
// clock: the zero Time before the first.
func (h *Heart) BeatAt() time.Time {
	if at := h.beatAt.Load(); at != 0 {
		return time.Unix(0, at)
	}
	return time.Time{}
}
