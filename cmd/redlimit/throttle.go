package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/redlimit/redlimit"
)

// throttle prints what `CL.THROTTLE KEY MAX_BURST COUNT PERIOD [QUANTITY]`
// would, in redis-cli's layout, so that redis-cell users can compare.
func throttle(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("throttle", "throttle [flags] KEY MAX_BURST COUNT PERIOD [QUANTITY]", `Prints the five values CL.THROTTLE answers: limited (0 or 1), limit
(MAX_BURST + 1), remaining, retry after and reset after (whole seconds; retry
after is -1 when allowed). COUNT requests per PERIOD seconds (or a Go duration
such as 500ms), in bursts of up to MAX_BURST + 1; QUANTITY defaults to 1.
Flags go before the arguments.

	redlimit throttle -r 6 user123 4 1 1
`, stderr)
	var be backend
	be.addFlags(fs)
	repeat := fs.Int("r", 1, "send the command this many times, as redis-cli -r does")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() != 4 && fs.NArg() != 5 {
		return usageError(fs, "want 4 or 5 arguments, got %d", fs.NArg())
	}
	key := fs.Arg(0)
	var badArg error
	integer := func(name, arg string) int64 {
		n, err := strconv.ParseInt(arg, 10, 64)
		if err != nil && badArg == nil {
			badArg = fmt.Errorf("%s %q is not an integer", name, arg)
		}
		return n
	}
	maxBurst, count, quantity := integer("MAX_BURST", fs.Arg(1)), integer("COUNT", fs.Arg(2)), int64(1)
	if fs.NArg() == 5 {
		quantity = integer("QUANTITY", fs.Arg(4))
	}
	if badArg != nil {
		return invalid(fs, "%v", badArg)
	}
	period, err := parsePeriod(fs.Arg(3))
	if err != nil {
		return invalid(fs, "PERIOD %q: %v", fs.Arg(3), err)
	}
	if *repeat < 1 {
		return invalid(fs, "-r %d: want at least 1", *repeat)
	}

	if code, ok := be.start(ctx, fs); !ok {
		return code
	}
	defer be.close()
	rdb := be.newClient()
	defer rdb.Close()
	client := redlimit.New(rdb)
	for range *repeat {
		r, err := client.Throttle(ctx, key, maxBurst, count, period, quantity)
		if errors.Is(err, redlimit.ErrInvalidConfig) || errors.Is(err, redlimit.ErrInvalidPermits) {
			// The library owns the rules for MAX_BURST, COUNT, PERIOD and
			// QUANTITY, and checks them before sending anything: its refusal
			// is a bad command line, not a failed command.
			return invalid(fs, "%v", err)
		}
		if err != nil {
			fmt.Fprintf(stderr, "redlimit throttle: %s\n", strings.TrimPrefix(err.Error(), "redlimit: "))
			return exitFail
		}
		limited := 0
		if r.Limited {
			limited = 1
		}
		for i, v := range []int64{int64(limited), r.Limit, r.Remaining, r.RetryAfter, r.ResetAfter} {
			fmt.Fprintf(stdout, "%d) (integer) %d\n", i+1, v)
		}
	}
	return exitOK
}

// parsePeriod reads CL.THROTTLE's period, whole seconds, or a Go duration.
func parsePeriod(s string) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("want whole seconds or a duration such as 500ms")
	}
	return d, nil
}
