package degradedlocal

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redlimit/redlimit/internal/local"
	"github.com/redlimit/redlimit/internal/wire"
)

type cfg struct{ rate int64 }

func equal(a, b cfg) bool { return a == b }

func TestLearnTakesTheDefaultWhenItsLimitsAreReported(t *testing.T) {
	var f Family[cfg]
	dflt := cfg{10}
	quotas := []Quota{{Limit: 10, Window: time.Second}}
	read := func(context.Context) (cfg, error) {
		t.Fatal("the default's limits: nothing to read")
		return cfg{}, nil
	}
	if f.Knows(quotas) {
		t.Fatal("nothing seen yet")
	}
	f.Learn(Learning[cfg]{Quotas: quotas, Default: &dflt, DefaultRates: []wire.Rate{{Rate: 10, IntervalMS: 1000}}, Read: read, InOrder: true})
	if s := f.Seen(); s == nil || s.Config != dflt || !f.Knows(quotas) {
		t.Fatalf("seen %+v", s)
	}
}

func TestLearnReadsTheStoredConfigOnce(t *testing.T) {
	var f Family[cfg]
	reads := 0
	read := func(context.Context) (cfg, error) { reads++; return cfg{9}, nil }
	quotas := []Quota{{Limit: 9, Window: time.Minute}}
	f.Learn(Learning[cfg]{Quotas: quotas, Read: read, Timeout: time.Second, InOrder: true})
	if s := f.Seen(); s == nil || s.Config != (cfg{9}) || reads != 1 || !f.Knows(quotas) {
		t.Fatalf("seen %+v after %d reads", s, reads)
	}
	var failed Family[cfg]
	failed.Learn(Learning[cfg]{Quotas: quotas, Read: func(context.Context) (cfg, error) { return cfg{}, errors.New("down") },
		Timeout: time.Second, InOrder: true})
	if failed.Seen() != nil {
		t.Fatal("a read that failed teaches nothing")
	}
}

func TestDecideWithinTheShare(t *testing.T) {
	var f Family[cfg]
	rates := func() []Rate { return []Rate{{Rate: local.Rate{Rate: 9, IntervalMS: 60_000}, Full: 9}} }
	c := Config[cfg]{Config: cfg{9}, Equal: equal, N: 3, Rates: rates, Algorithm: wire.FixedWindow.Name, Retry: 5 * time.Second}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	granted := 0
	var last Outcome
	for range 5 {
		o, ok := f.Decide(c, now, 1)
		if !ok {
			t.Fatal("not decided")
		}
		if o.Allowed {
			granted++
		}
		last = o
	}
	if granted != 3 || last.Limit != 3 || last.Window != time.Minute || last.RetryAfter <= 0 {
		t.Fatalf("granted %d, last %+v: want ⌈9 / 3⌉", granted, last)
	}
	if o, _ := f.Decide(c, now, 10); o.Allowed || o.RetryAfter != never {
		t.Fatalf("above the rate's own capacity: %+v", o)
	}
	if o, _ := f.Decide(c, now, 4); o.Allowed || o.RetryAfter != 5*time.Second {
		t.Fatalf("above the share only: told to retry after a heartbeat, %+v", o)
	}
	c.N = 1
	if o, _ := f.Decide(c, now, 1); !o.Allowed || o.Limit != 9 {
		t.Fatalf("a new instance count starts afresh: %+v", o)
	}
}
