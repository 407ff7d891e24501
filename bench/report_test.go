package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		in := slices.Clone(tc.xs)
		if got := median(tc.xs); got != tc.want || !slices.Equal(in, tc.xs) {
			t.Errorf("median(%v) = %v, want %v, input unchanged", in, got, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var h histogram
	if got := h.percentile(0.5); got != 0 {
		t.Fatalf("empty histogram: p50 = %v, want 0", got)
	}
	// 1..1000 µs, one each, and 1 s: within the histogram's 2% resolution.
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	var other histogram
	other.record(time.Second)
	other.record(math.MaxInt64) // lands in a bucket
	other.record(-1)
	h.merge(&other)
	for p, want := range map[float64]time.Duration{0.5: 500 * time.Microsecond, 0.99: 990 * time.Microsecond, 0.999: time.Second} {
		if got := h.percentile(p); math.Abs(float64(got-want)) > float64(want)/50 {
			t.Errorf("p%v = %v, want %v ± 2%%", p*100, got, want)
		}
	}
}

func TestFormatting(t *testing.T) {
	for _, tc := range [][2]string{
		{fmtRate(0), "0"}, {fmtRate(999), "999"}, {fmtRate(41203.4), "41,203"}, {fmtRate(1234567), "1,234,567"},
		{fmtDur(0), "–"}, {fmtDur(float64(520 * time.Nanosecond)), "0.5µs"}, {fmtDur(float64(312 * time.Microsecond)), "312µs"},
		{fmtDur(float64(12340 * time.Microsecond)), "12.3ms"}, {fmtTTL(-1), "none"}, {fmtTTL(-2), "expired"}, {fmtTTL(14999 * time.Millisecond), "14.999s"},
	} {
		if tc[0] != tc[1] {
			t.Errorf("got %q, want %q", tc[0], tc[1])
		}
	}
}

// TestBatchingTables builds the batching section from made-up samples whose
// figures are known: the funnel's 64 callers made 6,400 decisions in 400
// calls taking 16,000 µs, so 16 decisions per call and 2.50 µs per decision,
// against redis_rate's 36,000 µs over 3,000 decisions (12.00).
func TestBatchingTables(t *testing.T) {
	made := func(name string, ours bool, samples ...sample) *contender {
		return &contender{name: name, ours: ours, samples: samples}
	}
	at := func(decisions uint64, calls, usec int64, rate float64, p50, p99 time.Duration) sample {
		return sample{tally: tally{decisions: decisions}, script: scriptStats{calls: calls, usec: usec}, rate: rate, p50: p50, p99: p99}
	}
	alone := &scenario{name: "1 caller", callers: 1, contenders: []*contender{
		made(redisRate, false, at(1000, 1000, 15000, 10000, 75*time.Microsecond, 200*time.Microsecond)),
		made(funnel.name, true, at(1000, 1000, 12000, 12000, 60*time.Microsecond, 180*time.Microsecond)),
		made(funnel.name+batchingOff, true, at(1000, 1000, 13000, 10000, 70*time.Microsecond, 190*time.Microsecond)),
	}}
	crowd := &scenario{name: "64 callers", callers: 64, contenders: []*contender{
		made(redisRate, false, at(3000, 3000, 36000, 30000, time.Millisecond, 3*time.Millisecond)),
		made(funnel.name, true, at(6400, 400, 16000, 64000, time.Millisecond, 2*time.Millisecond)),
	}}
	flood := &scenario{name: "flood", callers: 64, flood: true, contenders: []*contender{made(funnel.name+", local cache", true, at(5000, 1, 10, 5e6, 0, 0))}}
	var b strings.Builder
	(&report{scenarios: []*scenario{alone, crowd, flood}}).batching(func(format string, a ...any) { fmt.Fprintf(&b, format, a...) })
	got := b.String()
	for _, want := range []string{
		"| 1 caller | 12.00 | 13.00 | – | 15.00 | – | 0.80 | – | 1.20 |\n",
		"| 64 callers | 2.50 | – | – | 12.00 | – | 0.21 | – | – |\n",
		"| limiter | 1 caller | 64 callers |\n|---|--:|--:|\n",
		"| Funnel | 1.00 | 16.00 |\n",
		"| Funnel, batching off | 1.00 | – |\n",
		"redis_rate: p50 75µs, p99 200µs.",
		"| Funnel | 60µs | 180µs | 70µs | 190µs | 0.86 | 0.95 | 1.20 | 12.00 | 13.00 |\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "| Funnel, local cache |") || strings.Contains(got, " flood |") {
		t.Errorf("the flood scenario is in the batching tables:\n%s", got)
	}
}
