package redlimit

// TokenBucket returns the limiter called name (after the Client's prefix) as
// Redisson's RRateLimiter keeps it: a log of grants, each given back exactly
// Interval after it was made. At most Rate permits are granted in any span of
// Interval; a full bucket grants all of them at once. Grants in one slice of
// the Interval (Interval/64) share a record, freed with the latest of them:
// the log holds at most 65 records, which bounds both Redis memory and each
// call's work, and the bucket may under-admit by one slice's permits for at
// most one slice. Rate must be below 2^32: Redisson's records count permits
// in 4 bytes.
//
// Its keys are byte-compatible with Redisson 3.21+ (the NAME hash, the
// {NAME}:value string and the {NAME}:permits zset), so Java services on
// Redisson and Go services on redlimit can share one limiter.
func (c *Client) TokenBucket(name string) *Limiter { return c.limiter(name, tokenBucket) }

var tokenBucket = newAlgorithm(algorithm{name: "tokenbucket", state: []string{"value", "permits", "grants"}, records: true, charges: true}, "tokenbucket.lua")
