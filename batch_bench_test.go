package redlimit

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redlimit/redlimit/internal/redistest"
)

// BenchmarkDecisions decides on a real redis-server from 64 goroutines over
// 10,000 keys, as the bench module's main scenario does, with batching on
// and off: a profile of the whole decision path, and batch sizes.
func BenchmarkDecisions(b *testing.B) {
	s := redistest.Shared(b)
	for _, batching := range []bool{true, false} {
		b.Run("batching="+strconv.FormatBool(batching), func(b *testing.B) {
			opts := []Option{WithPrefix(redistest.UniqueName(b, "bench"))}
			if !batching {
				opts = append(opts, WithoutBatching())
			}
			rdb := s.Client(b)
			c := New(rdb, opts...)
			admin := s.Client(b)
			if err := admin.ConfigResetStat(context.Background()).Err(); err != nil {
				b.Fatal(err)
			}
			cfg := Config{Rate: 1_000_000, Interval: time.Second}
			var next atomic.Int64
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					key := strconv.FormatInt(next.Add(1)%10_000, 10)
					if _, err := c.Funnel(key).WithDefault(cfg).Allow(ctx, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			info, err := admin.Info(context.Background(), "commandstats").Result()
			if err != nil {
				b.Fatal(err)
			}
			if _, rest, ok := strings.Cut(info, "cmdstat_evalsha:"); ok {
				_, calls, _ := strings.Cut(rest, "calls=")
				n, _ := strconv.ParseFloat(calls[:strings.IndexByte(calls, ',')], 64)
				_, rest, _ = strings.Cut(rest, "usec=")
				usec, _ := strconv.ParseFloat(rest[:strings.IndexByte(rest, ',')], 64)
				b.ReportMetric(usec/float64(b.N), "redis-µs/decision")
				b.ReportMetric(float64(b.N)/n, "decisions/call")
			}
			if calls, decisions := c.transport.BatchStats(); calls > 0 {
				b.ReportMetric(float64(decisions)/float64(calls), "decisions/batch")
			}
		})
	}
}

// BenchmarkClusterHotKey decides on one key of the local Redis Cluster from
// 64 goroutines, with batching on and off: the decisions of one slot share
// a call.
func BenchmarkClusterHotKey(b *testing.B) {
	cluster := redistest.SharedCluster(b)
	for _, batching := range []bool{true, false} {
		b.Run("batching="+strconv.FormatBool(batching), func(b *testing.B) {
			opts := []Option{WithPrefix(redistest.UniqueName(b, "bench"))}
			if !batching {
				opts = append(opts, WithoutBatching())
			}
			c := New(cluster.Client(b), opts...)
			l := c.Funnel("hot").WithDefault(Config{Rate: 1_000_000, Interval: time.Millisecond * 1000, Burst: 1_000_000_000})
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if _, err := l.Allow(ctx, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			if calls, decisions := c.transport.BatchStats(); calls > 0 {
				b.ReportMetric(float64(decisions)/float64(calls), "decisions/batch")
			}
		})
	}
}

// BenchmarkLoneCaller measures what batching costs a caller who is alone:
// one goroutine decides on a real redis-server through two Clients, one
// with batching and one without, in turns of 200 decisions that alternate
// (so that the machine's moods, which move a figure by a fifth within
// seconds, meet both alike), and reports each side's p50 and p99 latency
// over the other's. The target is at most 1.05.
func BenchmarkLoneCaller(b *testing.B) {
	s := redistest.Shared(b)
	prefix := redistest.UniqueName(b, "lone")
	on := New(s.Client(b), WithPrefix(prefix+":on:"))
	off := New(s.Client(b), WithPrefix(prefix+":off:"), WithoutBatching())
	cfg := Config{Rate: 1_000_000, Interval: time.Second}
	ctx := context.Background()
	var took [2][]time.Duration
	const turn = 200
	b.ResetTimer()
	for n := 0; n < b.N; {
		for side, c := range []*Client{on, off} {
			for i := 0; i < turn && n < b.N; i, n = i+1, n+1 {
				l := c.FixedWindow(strconv.Itoa(n % 1000)).WithDefault(cfg)
				start := time.Now()
				if _, err := l.Allow(ctx, 1); err != nil {
					b.Fatal(err)
				}
				took[side] = append(took[side], time.Since(start))
			}
		}
	}
	b.StopTimer()
	if len(took[1]) < 100 {
		return // too few to say: the runs before b.N settles
	}
	percentile := func(side int, q float64) float64 {
		d := slices.Clone(took[side])
		slices.Sort(d)
		return float64(d[int(q*float64(len(d)-1))])
	}
	b.ReportMetric(percentile(0, 0.5)/percentile(1, 0.5), "p50-on/off")
	b.ReportMetric(percentile(0, 0.99)/percentile(1, 0.99), "p99-on/off")
}
