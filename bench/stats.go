package main

import (
	"math/bits"
	"slices"
	"time"
)

// subBits gives each power of two 2^subBits sub-buckets, so a recorded
// latency is known to within 1/32 (3%) of itself.
const (
	subBits    = 5
	subBuckets = 1 << subBits
	// Enough buckets for any int64 nanoseconds.
	histBuckets = (64 - subBits) * subBuckets
)

// histogram counts latencies in log-linear buckets. Recording is an array
// increment: it never allocates, so it does not disturb the allocation count
// of the code being measured.
type histogram struct {
	counts [histBuckets]uint64
	total  uint64
}

func bucketOf(ns int64) int {
	if ns < subBuckets {
		return int(max(ns, 0))
	}
	shift := bits.Len64(uint64(ns)) - subBits - 1
	return (shift+1)*subBuckets + int(uint64(ns)>>shift) - subBuckets
}

// bucketValue is the middle of bucket i, in nanoseconds.
func bucketValue(i int) int64 {
	if i < subBuckets {
		return int64(i)
	}
	shift := i/subBuckets - 1
	low := int64(i%subBuckets+subBuckets) << shift
	return low + (int64(1)<<shift)/2
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(int64(d))]++
	h.total++
}

func (h *histogram) merge(o *histogram) {
	for i, n := range o.counts {
		h.counts[i] += n
	}
	h.total += o.total
}

// percentile returns the latency below which a fraction p (0..1] of the
// recorded ones lie; 0 when nothing was recorded.
func (h *histogram) percentile(p float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(p*float64(h.total) + 0.999999)
	rank = min(max(rank, 1), h.total)
	var seen uint64
	for i, n := range h.counts {
		seen += n
		if seen >= rank {
			return time.Duration(bucketValue(i))
		}
	}
	return time.Duration(bucketValue(histBuckets - 1))
}

// median returns the middle of xs (the mean of the two middle ones for an
// even count), or 0 for none. xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// pairedRatio is the median over rounds of a's figure over b's in the same
// round: the two were measured minutes apart at most, so a slower machine
// slows both.
func pairedRatio(a, b *result, figure func(sample) float64) float64 {
	var xs []float64
	for i := range min(len(a.samples), len(b.samples)) {
		if y := figure(b.samples[i]); y > 0 {
			xs = append(xs, figure(a.samples[i])/y)
		}
	}
	return median(xs)
}
