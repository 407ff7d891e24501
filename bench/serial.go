package main

import (
	"context"
	"fmt"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redlimit/redlimit"
)

// serialRow is one contender's Redis time per call with one caller.
type serialRow struct {
	name    string
	usec    float64 // the least usec_per_call of EVALSHA over the rounds
	vsPeer  float64 // the median, over rounds, of usec ÷ redis_rate's usec in the same round
	vsFloor float64 // the same against the trivial EVALSHA
}

// runSerial measures what each script costs the server, free of the client
// side: one caller, calls in sequence, contenders interleaved round after
// round, usec_per_call of EVALSHA from INFO commandstats. With 64 or 512
// callers on 2 shared cores, the server's figures also count the time it
// waits for the CPU; here they are as close to the script's own cost as a
// shared machine allows, and the ratios are taken within a round.
func (c *checks) runSerial(ctx context.Context, e *env) error {
	const rounds, calls, keys = 7, 2000, 1000
	big := redlimit.PerSecond(bigRate)
	client := redlimit.New(e.rdb)
	peer := redis_rate.NewLimiter(e.rdb)
	peerLimit := redis_rate.PerSecond(bigRate)
	if err := e.rdb.ScriptLoad(ctx, trivial).Err(); err != nil {
		return err
	}
	type contender struct {
		name string
		call func(i int) error
	}
	contenders := []contender{
		{"trivial EVALSHA", func(i int) error {
			return e.rdb.EvalSha(ctx, trivialSHA, []string{fmt.Sprintf("bench:serial:t:%d", i%keys)}).Err()
		}},
		{"redis_rate", func(i int) error {
			_, err := peer.Allow(ctx, fmt.Sprintf("bench:serial:p:%d", i%keys), peerLimit)
			return err
		}},
	}
	for _, alg := range algorithms {
		limiters := make([]*redlimit.Limiter, keys)
		for i := range limiters {
			limiters[i] = alg.new(client, fmt.Sprintf("bench:serial:%s:%d", alg.short, i)).WithDefault(big)
		}
		contenders = append(contenders, contender{alg.name, func(i int) error {
			_, err := limiters[i%keys].Allow(ctx, 1)
			return err
		}})
	}
	usec := make([][]float64, len(contenders)) // [contender][round]
	for round := range rounds {
		for ci, ct := range contenders {
			if err := e.admin.ConfigResetStat(ctx).Err(); err != nil {
				return err
			}
			for i := range calls {
				if err := ct.call(round*calls + i); err != nil {
					return fmt.Errorf("%s: %w", ct.name, err)
				}
			}
			_, per, err := evalshaStats(ctx, e.admin)
			if err != nil {
				return err
			}
			usec[ci] = append(usec[ci], per)
		}
	}
	for ci, ct := range contenders {
		row := serialRow{name: ct.name, usec: usec[ci][0]}
		var vsPeer, vsFloor []float64
		for r := range rounds {
			row.usec = min(row.usec, usec[ci][r])
			vsFloor = append(vsFloor, usec[ci][r]/usec[0][r])
			vsPeer = append(vsPeer, usec[ci][r]/usec[1][r])
		}
		row.vsPeer, row.vsFloor = median(vsPeer), median(vsFloor)
		c.serial = append(c.serial, row)
	}
	return nil
}
