// Package requestid names decision requests: the token bucket's record, an
// entry of a limiter's request log (WithRetryWindow, a reservation, a
// lease's block), and what a release or a settle names to find its grant.
package requestid

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
)

// ID is a request's id: 16 hex digits in one allocation, where a string
// would take two (its bytes, and its box as an argument). go-redis writes
// it through MarshalBinary.
type ID [16]byte

// New returns a random id.
func New() *ID {
	id := new(ID)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	hex.Encode(id[:], b[:])
	return id
}

// MarshalBinary is the id as a script argument.
func (id *ID) MarshalBinary() ([]byte, error) { return id[:], nil }
