package main

import (
	"math"
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
		for i := range in {
			if in[i] != tc.xs[i] {
				t.Fatalf("median reordered its input: %v", tc.xs)
			}
		}
	}
}

// Every value lands in a bucket whose middle is within 1/32 of it, and
// bucket indexes grow with the value.
func TestHistogramBuckets(t *testing.T) {
	prev := -1
	for ns := int64(0); ns < 1<<20; ns += 1 + ns/97 {
		b := bucketOf(ns)
		if b < prev {
			t.Fatalf("bucketOf(%d) = %d, below bucketOf of a smaller value (%d)", ns, b, prev)
		}
		prev = b
		if v := bucketValue(b); math.Abs(float64(v-ns)) > float64(ns)/32+1 {
			t.Fatalf("bucketValue(bucketOf(%d)) = %d, more than 1/32 off", ns, v)
		}
	}
	if b := bucketOf(math.MaxInt64); b >= histBuckets {
		t.Fatalf("bucketOf(MaxInt64) = %d, outside %d buckets", b, histBuckets)
	}
}

func TestPercentile(t *testing.T) {
	var h histogram
	if got := h.percentile(0.5); got != 0 {
		t.Fatalf("empty histogram: p50 = %v, want 0", got)
	}
	// 1..1000 µs, one each: p50 is 500 µs, p99 990 µs, within the 3% resolution.
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	var other histogram
	other.record(time.Second)
	h.merge(&other)
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{
		{0.5, 500 * time.Microsecond},
		{0.99, 990 * time.Microsecond},
		{1, time.Second},
	} {
		got := h.percentile(tc.p)
		if d := math.Abs(float64(got - tc.want)); d > float64(tc.want)/32 {
			t.Errorf("p%v = %v, want %v ± 3%%", tc.p*100, got, tc.want)
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
		{fmtDur(0), "–"},
		{fmtDur(float64(312 * time.Microsecond)), "312µs"},
		{fmtDur(float64(520 * time.Nanosecond)), "0.5µs"},
		{fmtDur(float64(12340 * time.Microsecond)), "12.3ms"},
		{fmtRatio(0), "–"},
		{fmtRatio(0.8049), "0.80"},
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
		{[]measure{judge("a", "1.2×", 1.2, 1, true), judge("b", "0.5 µs", 0.5, 0.8, false)}, "| t | a: 1.2×<br>b: 0.5 µs | **met** |\n"},
		{[]measure{judge("a", "0.6×", 0.6, 1, true), judge("b", "1.0×", 1, 1, true)}, "| t | a: 0.6×<br>b: 1.0× | **missed** by 40% (1 of 2) |\n"},
		{[]measure{judge("a", "", 0.6, 1, true), judge("b", "", 1.2, 0.8, false)}, "| t | a: <br>b:  | **missed** by 40–50% (2 of 2) |\n"},
		{[]measure{yesNo("", "0 keys", true)}, "| t | 0 keys | **met** |\n"},
		{[]measure{yesNo("a", "ok", true), yesNo("b", "2 left", false)}, "| t | a: ok<br>b: 2 left | **missed** in 1 of 2 |\n"},
	} {
		if got := targetRow("t", tc.ms); got != tc.want {
			t.Errorf("targetRow = %q, want %q", got, tc.want)
		}
	}
}

// A report of a run that measured nothing still renders, every target
// "not measured" rather than met.
func TestEmptyReport(t *testing.T) {
	rep := &report{options: options{rounds: 1, duration: time.Second, callers: []int{64}, keys: 10}}
	md := rep.markdown()
	if !strings.Contains(md, "## Targets (issue 9)") || strings.Contains(md, "**met**") {
		t.Errorf("report:\n%s", md)
	}
}
