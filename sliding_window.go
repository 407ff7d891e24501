package redlimit

// SlidingWindow returns the limiter called name (after the Client's prefix)
// as window counters: Interval split into Buckets sub-windows (0: 10), a
// decision summing the last Buckets of them. No span shorter than
// Interval × (Buckets−1)/Buckets holds more than Rate grants. Its state is one
// field of the limiter's hash listing at most Buckets counters.
func (c *Client) SlidingWindow(name string) *Limiter { return c.limiter(name, slidingWindow) }

var slidingWindow = newAlgorithm(algorithm{name: "sliding_window", state: []string{"buckets"}, inConfig: true, buckets: true, charges: true}, "sliding_window.lua")
