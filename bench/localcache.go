package main

import "github.com/redlimit/redlimit"

// localCache returns the Client option that turns on the local deny cache,
// and whether the library has one; the flood scenario measures the cached
// limiters only when it does. (It stands apart so that the benchmark could
// be built while the option was being written.)
func localCache() (redlimit.Option, bool) { return redlimit.WithLocalCache(), true }
