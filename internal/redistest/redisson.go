package redistest

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedissonPermit is a permit record as Redisson 3.21+ writes it in its
// permits zset: struct.pack('Bc0I', 16, 16 random bytes, permits), the 16
// bytes here all id.
func RedissonPermit(id byte, permits uint32) string {
	b := make([]byte, 21)
	b[0] = 16
	for i := 1; i <= 16; i++ {
		b[i] = id
	}
	binary.LittleEndian.PutUint32(b[17:], permits)
	return string(b)
}

// WriteRedisson writes a token bucket called name as Redisson would, byte
// for byte: 5 permits per 10 s, of which 2 are left at now, 2 granted 4 s
// before (RedissonPermit(1, 2)) and 1 granted 1 s before
// (RedissonPermit(2, 1)).
func WriteRedisson(ctx context.Context, rdb redis.Cmdable, name string, now time.Time) {
	ms := now.UnixMilli()
	rdb.HSet(ctx, name, "rate", "5", "interval", "10000", "type", "0", "keepAliveTime", "0")
	rdb.Set(ctx, "{"+name+"}:value", "2", 0)
	rdb.ZAdd(ctx, "{"+name+"}:permits",
		redis.Z{Score: float64(ms - 4000), Member: RedissonPermit(1, 2)},
		redis.Z{Score: float64(ms - 1000), Member: RedissonPermit(2, 1)})
}
