package redlimit

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/wire"
)

// plainScripter is a redis.Scripter and nothing more: no Process, so the
// runtime sends its scripts through EvalSha.
type plainScripter struct{ redis.Scripter }

// A Scripter that cannot process a ready-made command gets the same
// decisions, and the same recovery from NOSCRIPT, through EvalSha.
func TestPlainScripter(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		log := &commandLog{}
		logged := recorded(t, rdb, log)
		name := uniqueName(t)
		l := a.new(newClient(plainScripter{logged}, newClock()), name).WithDefault(tenPer10s)
		scriptFlush(t, rdb)
		for i := range 11 {
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, i < 10, ok, "attempt %d", i)
		}
		assert.Equal(t, 1, log.count("script load"))
		assert.Equal(t, 12, log.count("evalsha"), "11 decisions, one of them twice")
		require.NoError(t, l.SetRate(ctx, Config{Type: PerClient, Rate: 2, Interval: time.Minute}))
		ok, err := l.TryAcquire(ctx, 2)
		require.NoError(t, err)
		assert.True(t, ok, "PerClient: every key sent")
		assertAvailable(t, l, 0)
	})
}

// A Ring's ScriptLoad reaches one shard; the runtime loads every shard.
func TestRing(t *testing.T) {
	ctx := context.Background()
	a, b := redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr(), "b": b.Addr()}})
	t.Cleanup(func() { ring.Close() })
	c := newClient(ring, newClock())
	for round := range 2 {
		for _, s := range []*redistest.Server{a, b} {
			require.NoError(t, s.Client(t).ScriptFlush(ctx).Err())
		}
		for i := range 20 {
			l := c.TokenBucket(uniqueName(t)).WithDefault(tenPer10s)
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err, "round %d limiter %d", round, i)
			assert.True(t, ok)
		}
	}
	for _, s := range []*redistest.Server{a, b} {
		assert.Positive(t, s.Client(t).DBSize(ctx).Val(), "limiters spread over both shards")
	}
}

// An AutoPipeliner batches calls from many goroutines; NOSCRIPT inside a batch
// is handled per call.
func TestAutoPipeliner(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Shared(t).Client(t)
	ap, err := rdb.AutoPipeline()
	require.NoError(t, err)
	t.Cleanup(func() { ap.Close() })
	clk := newClock()
	c := newClient(ap, clk)
	for _, al := range algorithms {
		t.Run(al.name, func(t *testing.T) {
			l := al.new(c, uniqueName(t)).WithDefault(Per(100, time.Minute))
			require.NoError(t, rdb.ScriptFlush(ctx).Err())
			var wg sync.WaitGroup
			var mu sync.Mutex
			granted := 0
			for range 16 {
				wg.Go(func() {
					for range 20 {
						ok, err := l.TryAcquire(ctx, 1)
						assert.NoError(t, err)
						if ok {
							mu.Lock()
							granted++
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			assert.Equal(t, 100, granted, "320 requests, exactly the 100 permits granted")
		})
	}
}

// A decision's reply, any string: parseResult never panics, and what it
// accepts is a Result whose durations are in range, which written back as
// the scripts write it parses to itself.
func FuzzParseResult(f *testing.F) {
	for _, s := range []string{
		"h 1 10 9 0 100000 1000 0", "h 0 10 0 250000 1000000 1000 0", "h 0 10 0 -1 0 1000 1", // one rate
		"d 1 9 0 100000", "d 0 0 250000 1000000", "d 1 8 0 1000 1", // a default decided (PerSecond(10) and a further rate)
		"h 1 10 9 0 100000 1000 0 1 60 60000 0 0", "h 0 60 0 5 6 60000 1 1 10 1000 0 0 60 60000 0 0", // several rates
		"h 1 10 9 0 9223372036854776 1000 0", "h 2 10 9 0 1 1000 0", "h 1 10 9 0 1 -1 0", "h 1  10 9 0 1 1000 0", "", "1 10 9 0 1 1000 0",
		"h 1 10 9 0 1 1000 2", "h 1 10 9 0 1 1000", // shadow is 0 or 1, and always there
	} {
		f.Add(s)
	}
	dflt := PerSecond(10).And(PerMinute(60))
	f.Fuzz(func(t *testing.T, s string) {
		for _, dflt := range []Config{dflt, PerSecond(10)} {
			r, err := parseResult(s, dflt)
			if err != nil {
				require.ErrorIs(t, err, ErrUnexpectedReply)
				require.Equal(t, Result{}, r)
				continue
			}
			for _, d := range []time.Duration{r.RetryAfter, r.ResetAfter} {
				require.True(t, d >= 0 && d%time.Microsecond == 0 || d == Never, "%q: %v", s, d)
			}
			require.True(t, r.Window >= 0 && r.Window%time.Millisecond == 0, "%q: window %v", s, r.Window)
			if r.Quotas != nil {
				require.True(t, r.Bound >= 0 && r.Bound < len(r.Quotas), "%q: bound %d", s, r.Bound)
				require.Equal(t, Quota{Limit: r.Limit, Window: r.Window, ResetAfter: r.Quotas[r.Bound].ResetAfter}, r.Quotas[r.Bound], "%q", s)
				for _, q := range r.Quotas {
					require.True(t, q.ResetAfter >= 0 && q.ResetAfter%time.Microsecond == 0, "%q: a rate's reset %v", s, q.ResetAfter)
				}
				continue
			}
			back, err := parseResult(replyOf(r), dflt)
			require.NoError(t, err, "%q written back as %q", s, replyOf(r))
			require.Equal(t, r, back, "%q written back as %q", s, replyOf(r))
		}
	})
}

// replyOf writes a Result of one rate as the scripts reply it.
func replyOf(r Result) string {
	allowed := 0
	if r.Allowed {
		allowed = 1
	}
	us := func(d time.Duration) int64 {
		if d == Never {
			return -1
		}
		return int64(d / time.Microsecond)
	}
	shadow := 0
	if r.Shadow {
		shadow = 1
	}
	return fmt.Sprintf("h %d %d %d %d %d %d %d", allowed, r.Limit, r.Remaining, us(r.RetryAfter), us(r.ResetAfter), r.Window.Milliseconds(), shadow)
}

// Replies of any shape: the parsers never panic, and take only their own.
func FuzzReplyShapes(f *testing.F) {
	f.Add([]byte{5, 1, 1, 1, 1, 1})
	f.Add([]byte{2, 0, 3})
	f.Add([]byte{5, 2, 4, 5, 1, 2, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		reply := fuzzReply(&data, 0)
		if _, ok := reply.(string); !ok {
			_, err := parseResult(reply, PerSecond(10))
			require.ErrorIs(t, err, ErrUnexpectedReply, "%#v", reply)
		}
		if missing, ok := wire.MissingClients(reply); ok {
			v := reply.([]any)
			require.Equal(t, "missing", v[0])
			require.Len(t, missing, len(v[1].([]any)))
		}
		var n [6]int64
		if v, ok := reply.([]any); ok && len(v) == len(n) && wire.Integers(v, n[:]) {
			for i := range n {
				require.Equal(t, v[i], n[i])
			}
		}
	})
}

// fuzzReply decodes bytes into a RESP-like reply: nil, int64, string, float
// or a nested array.
func fuzzReply(data *[]byte, depth int) any {
	next := func() byte {
		if len(*data) == 0 {
			return 0
		}
		b := (*data)[0]
		*data = (*data)[1:]
		return b
	}
	switch next() % 6 {
	case 0:
		return nil
	case 1:
		var b [8]byte
		for i := range b {
			b[i] = next()
		}
		return int64(binary.LittleEndian.Uint64(b[:]))
	case 2:
		return strings.Repeat("x", int(next()%4))
	case 3:
		return float64(next()) / 3
	case 4:
		return "missing"
	default:
		if depth > 3 {
			return nil
		}
		v := make([]any, next()%8)
		for i := range v {
			v[i] = fuzzReply(data, depth+1)
		}
		return v
	}
}

func TestScriptsAreIntegersOnly(t *testing.T) {
	// Redis truncates Lua floats in replies and real Redis prints numbers
	// with %.14g when concatenated: no script may concatenate a number.
	for _, s := range scripts.All() {
		assert.NotContains(t, s.Source, "tostring(", s.Name)
		assert.NotContains(t, s.Source, "#!lua", "%s: shebangs break miniredis and Dragonfly", s.Name)
	}
}
