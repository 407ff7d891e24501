// Command bench measures redlimit against the one-round-trip ceiling (a
// trivial EVALSHA) and against github.com/go-redis/redis_rate (through a
// plain go-redis Client and through its AutoPipeliner), on a
// redis-server it starts for itself (the first on PATH, through
// internal/redistest as the tests start theirs), and writes the figures to
// BENCHMARKS.md. The tests own correctness; this measures.
//
// From the repository root:
//
//	go run ./bench                 # the full run BENCHMARKS.md holds
//	go run ./bench -duration 200ms -rounds 1 -out ''   # a quick look
//	PATH=$PWD/../shared/servers/valkey-8.0.1:$PATH go run ./bench -out ''
//
// Contenders take turns, round after round, so that a disturbance on the
// machine (other processes, thermal) spreads over all of them instead of
// landing on one; each figure is the median over the rounds, and each ratio
// the median of ratios taken within a round.
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
	"github.com/redlimit/redlimit/internal/redistest"
)

type options struct {
	rounds           int
	duration, warmup time.Duration
	callers          []int
	callersFlag      string
	keys             int
	out              string
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 3, "rounds; every contender is measured once per round")
	flag.DurationVar(&o.duration, "duration", 600*time.Millisecond, "measured time per contender per round")
	flag.DurationVar(&o.warmup, "warmup", 60*time.Millisecond, "unmeasured time before each measurement")
	flag.StringVar(&o.callersFlag, "callers", "1,64,512", "comma-separated numbers of concurrent callers")
	flag.IntVar(&o.keys, "keys", 10000, "keys the callers spread over (besides the one-hot-key scenario)")
	flag.StringVar(&o.out, "out", "BENCHMARKS.md", "file the report is written to; '' for stdout only")
	flag.Parse()
	for _, f := range strings.Split(o.callersFlag, ",") {
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
	} else if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run returns instead of exiting, so that its defers stop the server on
// every path; a signal cancels ctx, which ends the measurement early.
func run(o options) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	// The benchmark flushes this server between measurements, which is why
	// it never touches any other Redis.
	srv, stop, err := redistest.Launch()
	if err != nil {
		return err
	}
	defer stop()
	// Default options: what a service would start with (pool of
	// 10 × GOMAXPROCS connections, RESP3). admin runs FLUSHALL and INFO on
	// connections of its own, so those never queue behind the load.
	e := &env{
		rdb:   redis.NewClient(&redis.Options{Addr: srv.Addr()}),
		admin: redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 2}),
	}
	defer e.admin.Close()
	defer e.rdb.Close() // closes the AutoPipeliner too
	if e.ap, err = e.rdb.AutoPipeline(); err != nil {
		return err
	}
	rep, err := newReport(ctx, e, o)
	if err != nil {
		return err
	}
	rep.scenarios = makeScenarios(e, o)
	l := &load{env: e, warmup: o.warmup}
	for round := range o.rounds {
		for _, sc := range rep.scenarios {
			l.duration = o.duration / time.Duration(sc.parts)
			for p := range sc.parts {
				// Rotate the order each time so no contender always follows
				// the same one.
				for k := range sc.contenders {
					c := sc.contenders[(k+round*sc.parts+p)%len(sc.contenders)]
					s, err := l.measure(ctx, c, sc.callers, sc.keys)
					if err != nil {
						return fmt.Errorf("round %d, %s, %s: %w", round+1, sc.name, c.name, err)
					}
					c.samples = append(c.samples, s)
					log("round %d/%d  %-28s %-40s %9.0f/s  %6.2f µs  cpu %5.1f+%5.1f µs  p99 %-9v allocs %5.1f  errors %d",
						round+1, o.rounds, sc.name, c.name, s.rate, usec(s), s.clientCPU, s.serverCPU, s.p99, s.allocs, s.errors)
					if s.firstErr != nil {
						log("first error: %v", s.firstErr)
					}
				}
			}
		}
	}
	if err := runChecks(ctx, e, rep); err != nil {
		return err
	}
	text := rep.markdown()
	fmt.Print(text)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(text), 0o644); err != nil {
			return err
		}
		log("wrote %s (run took %v)", o.out, time.Since(rep.started).Round(time.Second))
	}
	return nil
}

// scenario is a load shape and the contenders measured under it.
type scenario struct {
	name       string
	callers    int
	keys       int
	parts      int          // slices per contender per round, so many short turns or one long one
	flood      bool         // the limit denies most requests
	leases     bool         // ours lease (Limiter.WithLease): a section of its own
	contenders []*contender // the first is the baseline of the × trivial column
}

func (sc *scenario) find(name string) *contender {
	if i := slices.IndexFunc(sc.contenders, func(c *contender) bool { return c.name == name }); i >= 0 {
		return sc.contenders[i]
	}
	return nil
}

// The suffixes of the contenders with several rates.
const twoRates, threeRates = ", two rates", ", three rates"

const (
	// bigRate is the limit of the throughput scenarios: far above what the
	// machine can decide, so every contender grants every request and does
	// the same work.
	bigRate = 1_000_000
	// floodRate is the limit of the flood scenario: one hot key hammered by
	// all callers, so nearly every request is denied.
	floodRate = 100
)

// makeScenarios: one caller, where each figure is as close to a call's own
// cost (Redis µs, Go allocations, latency) as a shared machine allows; then
// many callers over many keys and over one hot key, plain and
// auto-pipelined; then the flood. redis_rate runs through both the plain
// Client and the AutoPipeliner wherever ours does, so that batched decisions
// are judged against its best as well as its default.
func makeScenarios(e *env, o options) []*scenario {
	big, small := redlimit.PerSecond(bigRate), redlimit.PerSecond(floodRate)
	peers := func(perSecond int) []*contender {
		return []*contender{peer(redisRate, e.rdb, perSecond), peer(redisRate+autoPipelined, e.ap, perSecond)}
	}
	var out []*scenario
	for _, callers := range o.callers {
		if callers == 1 {
			// The Redis µs of one caller are what the targets compare, and
			// a shared machine moves them by the second: many short turns
			// pair each contender's with its peers' closely. A stored
			// config (SetRate) costs the script a little more than a
			// default; one scenario is enough to show how much. With one
			// caller, the key count hardly changes the cost.
			// Each further rate (Config.And) has a cost of its own: two
			// and three rates show it. Batching off shows what waiting to
			// form a batch costs a caller who is alone (the latency table):
			// each algorithm's turn with batching off follows its turn with
			// it on, so that their ratio pairs turns 150 ms apart.
			out = append(out, &scenario{name: "1 caller, 1000 keys", callers: 1, keys: 1000, parts: 4,
				contenders: slices.Concat([]*contender{ceiling("trivial EVALSHA", e.rdb), shaped(e.rdb)}, peers(bigRate),
					interleaved(everyAlgorithm("", e.rdb, big, nil), everyAlgorithm(batchingOff, e.rdb, big, nil, redlimit.WithoutBatching())),
					everyAlgorithm(", stored config", e.rdb, big, e.ap),
					everyAlgorithm(twoRates, e.rdb, big.And(redlimit.PerMinute(30*bigRate)), nil),
					everyAlgorithm(threeRates, e.rdb, big.And(redlimit.PerMinute(30*bigRate), redlimit.PerHour(1000*bigRate)), nil))})
			continue
		}
		// Many callers: decisions/s, which the machine's other tenants move
		// by a tenth or more from one second to the next. Short turns
		// taken in rotation pair each contender with redis_rate closely, as
		// for one caller. The funnel with batching off, paired with the
		// default in the same turns, shows what batching gains under load;
		// one algorithm is enough to show it, and the others would
		// lengthen the run by half a minute.
		for _, keys := range []int{o.keys, 1} {
			name := fmt.Sprintf("%d callers, %d keys", callers, keys)
			if keys == 1 {
				name = fmt.Sprintf("%d callers, 1 hot key", callers)
			}
			out = append(out, &scenario{name: name, callers: callers, keys: keys, parts: 4,
				contenders: slices.Concat([]*contender{ceiling("trivial EVALSHA", e.rdb), ceiling("trivial EVALSHA"+autoPipelined, e.ap)}, peers(bigRate),
					everyAlgorithm("", e.rdb, big, nil), everyAlgorithm(autoPipelined, e.ap, big, nil),
					[]*contender{ours(funnel.name+batchingOff, funnel, e.rdb, big, nil, redlimit.WithoutBatching())})})
		}
	}
	callers := o.callers[len(o.callers)-1]
	out = append(out, &scenario{name: fmt.Sprintf("flood: %d callers, 1 key, %d/s", callers, floodRate), callers: callers, keys: 1, parts: 1, flood: true,
		contenders: slices.Concat([]*contender{peer(redisRate, e.rdb, floodRate)},
			everyAlgorithm("", e.rdb, small, nil), everyAlgorithm(", local cache", e.rdb, small, nil, redlimit.WithLocalCache()))})
	// Leases: one hot limiter whose limit is far above what even local
	// decisions reach, so that every contender grants every request: a
	// config holds at most a permit per µs, so the window is long.
	hot := redlimit.Per(hotRate, hotRate*time.Microsecond)
	if slices.Contains(o.callers, 64) {
		callers = 64
	}
	var leased []*contender
	for _, alg := range algorithms {
		leased = append(leased, ours(alg.name+", leased", alg, e.rdb, hot, nil).withLease(leaseTime))
	}
	return append(out, &scenario{name: fmt.Sprintf("leases: %d callers, 1 hot limiter", callers), callers: callers, keys: 1, parts: 4, leases: true,
		contenders: slices.Concat(peers(hotRate), leased)})
}

// hotRate is the lease scenario's limit, per hotRate µs (a token bucket's
// rate is below 2^32), and leaseTime its lease time.
const (
	hotRate   = 4_000_000_000
	leaseTime = 100 * time.Millisecond
)

func log(format string, a ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", a...)
}
