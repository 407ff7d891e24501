package wire

// The in-flight script's contract (scripts/inflight.lua): its keys are the
// limit's config hash and its holds (KeyOf(name, SuffixHolders)).
const (
	InFlightOp     = 1 + iota // acquire | refresh | release | holders | get | set | tryset | reset | delete
	InFlightNow               // µs, or "" for Redis TIME
	InFlightHold              // the hold's id
	InFlightConfig            // "" or "source limit ttl-ms"
)

// InFlightAlgorithm is the name an in-flight limit's config hash stores in
// its algorithm field.
const InFlightAlgorithm = "inflight"

const (
	// MaxInFlightLimit bounds an in-flight limit: an acquire removes every
	// hold that has expired in one call, and a crash of every holder leaves
	// that many.
	MaxInFlightLimit = 100_000
	// MaxTTLMS bounds intervals, keep-alives and TTLs, ms: ten years keeps
	// now plus any of them, in µs, far inside the exact range of doubles.
	MaxTTLMS = 10 * 365 * 24 * 3600 * 1000
)
