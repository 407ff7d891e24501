package wire

// The in-flight script's contract (scripts/inflight.lua): its keys are the
// limit's config hash and its holds (KeyOf(name, SuffixHolders)).
const (
	InFlightOp     = 1 + iota // acquire | refresh | release | holders | get | set | tryset | reset | delete
	InFlightNow               // µs, or "" for Redis TIME
	InFlightHold              // the hold's id
	InFlightConfig            // "" or "source limit ttl-ms"
)

// The in-flight script's own ops; it shares get, set, tryset, reset and
// delete (OpGet …) with the admin script.
const (
	OpAcquire     Op = "acquire" // take a slot for the hold, if one is free
	OpRefresh     Op = "refresh" // renew the hold's expiry
	OpHoldRelease Op = "release" // give the hold's slot back
	OpHolders     Op = "holders" // the live holds and their expiries
)

// What the in-flight script says of a hold on a refresh or a release.
const (
	// HoldGone: not in Redis. Dropped by Reset or Delete, lost with Redis's
	// data, swept once it expired, or released.
	HoldGone    = iota
	HoldHeld    // live: refreshed, or released by this call
	HoldExpired // in Redis, at an expiry that has passed
)

// InFlightAlgorithm is the name an in-flight limit's config hash stores in
// its algorithm field.
const InFlightAlgorithm = "inflight"

const (
	// MaxInFlightLimit bounds an in-flight limit: an acquire removes every
	// hold that has expired in one call, and a crash of every holder leaves
	// that many.
	MaxInFlightLimit = 100_000
	// MinTTLMS bounds an in-flight TTL from below: a hold's lease ends a
	// tenth of it and 2ms before it, and must leave time to refresh.
	MinTTLMS = 10
	// MaxTTLMS bounds intervals, keep-alives and TTLs, ms: ten years keeps
	// now plus any of them, in µs, far inside the exact range of doubles.
	MaxTTLMS = 10 * 365 * 24 * 3600 * 1000
)
