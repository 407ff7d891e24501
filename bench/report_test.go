package main

import (
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
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := append([]float64(nil), tc.xs...)
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
		if !slices.Equal(in, tc.xs) {
			t.Fatalf("median reordered its input: %v", tc.xs)
		}
	}
}

func TestPercentile(t *testing.T) {
	var h histogram
	if got := h.percentile(0.5); got != 0 {
		t.Fatalf("empty histogram: p50 = %v, want 0", got)
	}
	// 1..1000 µs, one each: p50 is 500 µs, p99 990 µs, within the 2% resolution.
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	var other histogram
	other.record(time.Second)
	h.merge(&other)
	var extreme histogram
	extreme.record(math.MaxInt64) // lands in a bucket
	extreme.record(-1)
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{
		{0.5, 500 * time.Microsecond},
		{0.99, 990 * time.Microsecond},
		{1, time.Second},
	} {
		got := h.percentile(tc.p)
		if d := math.Abs(float64(got - tc.want)); d > float64(tc.want)/50 {
			t.Errorf("p%v = %v, want %v ± 2%%", tc.p*100, got, tc.want)
		}
	}
}

func TestFormatting(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{fmtRate(0), "0"},
		{fmtRate(999), "999"},
		{fmtRate(41203.4), "41,203"},
		{fmtRate(1234567), "1,234,567"},
		{fmtRate(-1234), "-1,234"},
		{fmtDur(0), "–"},
		{fmtDur(float64(312 * time.Microsecond)), "312µs"},
		{fmtDur(float64(520 * time.Nanosecond)), "0.5µs"},
		{fmtDur(float64(12340 * time.Microsecond)), "12.3ms"},
		{fmtTTL(-1), "none"},
		{fmtTTL(14999 * time.Millisecond), "14.999s"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestTargetRow(t *testing.T) {
	for _, tc := range []struct {
		ms   []measure
		want string
	}{
		{nil, "| t |  | not measured |\n"},
		{[]measure{judge("a", "1.2×", 1.2, 1, true), judge("", "0.5 µs", 0.5, 0.8, false)}, "| t | a: 1.2×<br>0.5 µs | **met** |\n"},
		{[]measure{judge("a", "0.6×", 0.6, 1, true), judge("b", "1.0×", 1, 1, true)}, "| t | a: 0.6× (**missed** by 40%)<br>b: 1.0× | **missed** (1 of 2) |\n"},
		{[]measure{judge("a", "x", 1.2, 0.8, false), judge("b", "2 left", 2, 0, false)}, "| t | a: x (**missed** by 50%)<br>b: 2 left (**missed**) | **missed** (2 of 2) |\n"},
	} {
		if got := targetRow("t", tc.ms); got != tc.want {
			t.Errorf("targetRow = %q, want %q", got, tc.want)
		}
	}
}

// A report of a run that measured nothing still renders, every target
// "not measured" rather than met.
func TestEmptyReport(t *testing.T) {
	rep := &report{options: options{rounds: 1, duration: time.Second, callers: []int{64}, keys: 10}, measures: map[string][]measure{}}
	md := rep.markdown()
	if !strings.Contains(md, "## Targets (issue 9)") || strings.Contains(md, "**met**") {
		t.Errorf("report:\n%s", md)
	}
}
