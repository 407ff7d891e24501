// Command bench measures redlimit against the one-round-trip ceiling (a
// trivial EVALSHA) and against github.com/go-redis/redis_rate, on a
// redis-server it starts for itself (the first on PATH), and writes the
// figures to BENCHMARKS.md.
//
// From the repository root:
//
//	go run ./bench                 # the full run BENCHMARKS.md holds
//	go run ./bench -duration 200ms -rounds 1 -out ''   # a quick look
//	PATH=$PWD/../shared/servers/valkey-8.0.1:$PATH go run ./bench -out ''
//
// Contenders take turns, round after round, so that a disturbance on the
// machine (other processes, thermal) spreads over all of them instead of
// landing on one; each figure is the median over the rounds.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
)

type options struct {
	rounds   int
	duration time.Duration
	warmup   time.Duration
	callers  []int
	keys     int
	checks   bool
	tables   bool
	only     string
	out      string
}

func main() {
	var o options
	var callers string
	flag.IntVar(&o.rounds, "rounds", 3, "rounds; every contender is measured once per round")
	flag.DurationVar(&o.duration, "duration", 600*time.Millisecond, "measured time per contender per round")
	flag.DurationVar(&o.warmup, "warmup", 100*time.Millisecond, "unmeasured time before each measurement")
	flag.StringVar(&callers, "callers", "64,512", "comma-separated numbers of concurrent callers")
	flag.IntVar(&o.keys, "keys", 10000, "keys the callers spread over (besides the one-hot-key scenario)")
	flag.BoolVar(&o.tables, "throughput", true, "run the throughput rounds")
	flag.StringVar(&o.only, "scenario", "", "run only the scenarios whose name contains this (e.g. flood)")
	flag.BoolVar(&o.checks, "checks", true, "run the one-caller, allocation, memory, keys and scaling measurements")
	flag.StringVar(&o.out, "out", "BENCHMARKS.md", "file the report is written to; '' for stdout only")
	flag.Parse()
	for _, f := range strings.Split(callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: -callers: %q is not a positive number\n", f)
			os.Exit(2)
		}
		o.callers = append(o.callers, n)
	}
	if o.rounds < 1 || o.duration <= 0 || o.keys < 1 {
		fmt.Fprintln(os.Stderr, "bench: -rounds, -duration and -keys must be positive")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run returns instead of exiting, so that its defers stop the server on
// every path; a signal cancels ctx, which ends the measurement early.
func run(o options) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	started := time.Now()

	addr, stop, err := startServer()
	if err != nil {
		return err
	}
	defer stop()
	// Default options: what a service would start with (pool of
	// 10 × GOMAXPROCS connections, RESP3).
	e := &env{
		rdb:   redis.NewClient(&redis.Options{Addr: addr}),
		admin: redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2}),
	}
	defer e.admin.Close()
	defer e.rdb.Close() // closes the AutoPipeliner too
	if e.ap, err = e.rdb.AutoPipeline(); err != nil {
		return err
	}

	rep := &report{options: o, started: started, poolSize: e.rdb.Options().PoolSize}
	if rep.machine, err = describeMachine(ctx, e.admin); err != nil {
		return err
	}
	log("machine: %s", rep.machine)

	scenarios := makeScenarios(e, o)
	l := &load{env: e, warmup: o.warmup, duration: o.duration}
	rep.results = make([][]*result, len(scenarios))
	for i, sc := range scenarios {
		for _, c := range sc.contenders {
			rep.results[i] = append(rep.results[i], &result{contender: c})
		}
	}
	rep.scenarios = scenarios

	for round := range o.rounds {
		for i, sc := range scenarios {
			n := len(sc.contenders)
			rs := make([]sample, n)
			// Rotate the order each round so no contender always follows
			// the same one.
			for k := range n {
				j := (k + round) % n
				s, err := measureOne(ctx, e, l, sc, sc.contenders[j])
				if err != nil {
					return fmt.Errorf("round %d, %s, %s: %w", round+1, sc.name, sc.contenders[j].name, err)
				}
				rs[j] = s
				log("round %d/%d  %-28s %-40s %9.0f/s  %6.2f µs  p99 %-9v allocs %5.1f  errors %d",
					round+1, o.rounds, sc.name, sc.contenders[j].name, s.rate, s.usec, s.p99, s.allocs, s.errors)
			}
			for j, s := range rs {
				rep.results[i][j].samples = append(rep.results[i][j].samples, s)
			}
		}
	}

	if o.checks {
		if rep.checks, err = runChecks(ctx, e, l, o); err != nil {
			return err
		}
	}
	rep.finished = time.Now()
	rep.machine.loadAfter = loadAverage()
	text := rep.markdown()
	fmt.Print(text)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(text), 0o644); err != nil {
			return err
		}
		log("wrote %s (run took %v)", o.out, time.Since(started).Round(time.Second))
	}
	return nil
}

// scenario is a load shape and the contenders measured under it.
type scenario struct {
	name       string
	callers    int
	keys       int
	flood      bool        // the limit denies most requests
	contenders []contender // the first is the baseline of the × trivial column
}

// The limit of the throughput scenarios is far above what the machine can
// decide, so every contender grants every request and does the same work.
const bigRate = 1_000_000

// floodRate is the limit of the flood scenario: one hot key hammered by all
// callers, so nearly every request is denied.
const floodRate = 100

func makeScenarios(e *env, o options) []*scenario {
	if !o.tables {
		return nil
	}
	big := redlimit.PerSecond(bigRate)
	var out []*scenario
	for ci, callers := range o.callers {
		for _, keys := range []int{o.keys, 1} {
			sc := &scenario{name: scenarioName(callers, keys), callers: callers, keys: keys}
			sc.contenders = append(sc.contenders,
				ceiling("trivial EVALSHA", e.rdb),
				ceiling("trivial EVALSHA, auto-pipelined", e.ap),
				peer("redis_rate", e.rdb, bigRate))
			for _, alg := range algorithms {
				sc.contenders = append(sc.contenders, ours(alg.name, alg, e.rdb, big, nil))
			}
			for _, alg := range algorithms {
				sc.contenders = append(sc.contenders, ours(alg.name+", auto-pipelined", alg, e.ap, big, nil))
			}
			// A stored config (SetRate) costs the script a little more than a
			// default; one scenario is enough to show how much.
			if ci == 0 && keys > 1 {
				for _, alg := range algorithms {
					sc.contenders = append(sc.contenders, ours(alg.name+", stored config", alg, e.rdb, big, e.ap))
				}
			}
			out = append(out, sc)
		}
	}
	out = slices.DeleteFunc(out, func(sc *scenario) bool { return !strings.Contains(sc.name, o.only) })
	callers := o.callers[len(o.callers)-1]
	flood := &scenario{name: fmt.Sprintf("flood: %d callers, 1 key, %d/s", callers, floodRate),
		callers: callers, keys: 1, flood: true}
	small := redlimit.PerSecond(floodRate)
	flood.contenders = append(flood.contenders, peer("redis_rate", e.rdb, floodRate))
	for _, alg := range algorithms {
		flood.contenders = append(flood.contenders, ours(alg.name, alg, e.rdb, small, nil),
			ours(alg.name+", local cache", alg, e.rdb, small, nil, redlimit.WithLocalCache()))
	}
	if strings.Contains(flood.name, o.only) {
		out = append(out, flood)
	}
	return out
}

func scenarioName(callers, keys int) string {
	k := fmt.Sprintf("%d keys", keys)
	if keys == 1 {
		k = "1 hot key"
	}
	return fmt.Sprintf("%d callers, %s", callers, k)
}

// measureOne runs one contender's slice on an empty database, so that no
// contender pays for another's keys (big logs, expiring state).
func measureOne(ctx context.Context, e *env, l *load, sc *scenario, c contender) (sample, error) {
	if err := e.admin.FlushAll(ctx).Err(); err != nil {
		return sample{}, err
	}
	decide, err := c.prepare(ctx, sc.keys)
	if err != nil {
		return sample{}, err
	}
	return l.run(ctx, decide, sc.callers, sc.keys)
}

func log(format string, a ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", a...)
}
