package main

import (
	"math"
	"slices"
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
