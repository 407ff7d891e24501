package redlimit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestConfigHelpers(t *testing.T) {
	assert.Equal(t, Config{Rate: 5, Interval: time.Second}, PerSecond(5))
	assert.Equal(t, Config{Rate: 5, Interval: time.Minute}, PerMinute(5))
	assert.Equal(t, Config{Rate: 5, Interval: time.Hour}, PerHour(5))
	assert.Equal(t, "5 per 1m0s per client, burst 7, keep alive 1h0m0s",
		Config{Type: PerClient, Rate: 5, Interval: time.Minute, Burst: 7, KeepAlive: time.Hour}.String())
	assert.Equal(t, "per-client", PerClient.String())
	assert.Equal(t, "RateType(9)", RateType(9).String())
}

// FuzzConfigValidate: validate never panics, and whatever it accepts keeps
// every quantity the scripts compute exact in a double (below 2^53), now and
// for the next decades.
func FuzzConfigValidate(f *testing.F) {
	f.Add(int64(10), int64(time.Second), int64(0), 0, int64(0), 0)
	f.Add(int64(1), int64(maxInterval), int64(1<<40), 1000, int64(maxInterval), 1)
	f.Add(int64(1_000_000), int64(time.Second), int64(1), 1, int64(0), 0)
	f.Fuzz(func(t *testing.T, rate, interval, burst int64, buckets int, keepAlive int64, typ int) {
		c := Config{Type: RateType(typ), Rate: rate, Interval: time.Duration(interval), Burst: burst, Buckets: buckets, KeepAlive: time.Duration(keepAlive)}
		if c.validate() != nil {
			return
		}
		d := c.withDefaults()
		const exact = 1 << 53
		nowUS := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		nowMS := nowUS / 1000
		intervalUS, intervalMS := d.Interval.Microseconds(), d.Interval.Milliseconds()
		emission := intervalUS / d.Rate
		if emission < 1 {
			t.Fatalf("%v: emission interval below 1µs", c)
		}
		if tolerance := emission * d.Burst; tolerance < 0 || nowUS+tolerance+intervalUS >= exact {
			t.Fatalf("%v: funnel tolerance %d leaves the exact range", c, tolerance)
		}
		if nowMS*int64(d.Buckets) >= exact || (nowMS/intervalMS+2)*intervalUS >= exact {
			t.Fatalf("%v: window arithmetic leaves the exact range", c)
		}
		if d.Buckets < 1 || int64(d.Buckets) > intervalMS || d.KeepAlive < 0 || (d.KeepAlive > 0 && d.KeepAlive < d.Interval) {
			t.Fatalf("%v: accepted", c)
		}
	})
}
