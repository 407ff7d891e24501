package redlimit

// FixedWindow returns the limiter called name (after the Client's prefix) as a
// counter per window: at most Rate permits in each window of Interval, windows
// aligned to the Unix epoch so that every instance agrees where one starts.
// Cheapest of all (two integer fields of the limiter's hash), but up to
// 2 × Rate can pass in one Interval that straddles a window edge.
func (c *Client) FixedWindow(name string) *Limiter { return c.limiter(name, fixedWindow) }

var fixedWindow = newAlgorithm(algorithm{name: "fixed_window", state: []string{"window"}, inConfig: true, calendar: true}, "fixed_window.lua")
