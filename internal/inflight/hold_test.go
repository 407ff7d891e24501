package inflight

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The margin the lease keeps, as the package redlimit's lease tests (inflight_lease_test.go) count it.
func TestInFlightLeaseMargin(t *testing.T) {
	for _, c := range []struct{ ttl, margin time.Duration }{
		{10 * time.Millisecond, 3 * time.Millisecond},
		{600 * time.Millisecond, 62 * time.Millisecond},
		{30 * time.Second, 3002 * time.Millisecond},
	} {
		assert.Equal(t, c.margin, LeaseMargin(c.ttl), fmt.Sprint(c.ttl))
	}
}
