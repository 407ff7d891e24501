package redlimit

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/wire"
)

// allowAny is Allow for the tables and models that ask for more than the
// limit too: there ErrPermitsExceedRate, with RetryAfter Never, is the
// answer they check, not a failure.
func allowAny(ctx context.Context, l *Limiter, permits int64) (Result, error) {
	r, err := l.Allow(ctx, permits)
	if errors.Is(err, ErrPermitsExceedRate) && r.RetryAfter == Never && !r.Allowed {
		err = nil
	}
	return r, err
}

// passHook is a go-redis hook that lets everything through: a hook embeds
// it and overrides what it acts on.
type passHook struct{}

func (passHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (passHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (passHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// commandLog is the tests' recording hook. It records every command a
// client is asked for, pipelined ones too, as the library asks for it (a
// whole call, go-redis's retries included): by name ("evalsha", "eval",
// "script load", …) and, for a script, by the script it runs ("evalsha
// SHA", "script load SHA"). With twice it sends every EVALSHA twice, as
// go-redis does when it re-sends a script after a read timeout: the script
// runs twice on the server.
type commandLog struct {
	passHook
	twice bool

	mu      sync.Mutex
	names   []string
	counts  map[string]int // by name and by script
	numKeys []any          // each EVALSHA's count of keys
	sources []string       // each decision's config source (ARGV[4]'s first word)
}

// recorded returns a new client to rdb's server(s) that records into log.
func recorded(t *testing.T, rdb redis.UniversalClient, log *commandLog) redis.UniversalClient {
	c := cloneClient(t, rdb)
	c.AddHook(log)
	return c
}

func (h *commandLog) record(cmd redis.Cmder) {
	args := cmd.Args()
	name, script := cmd.Name(), ""
	switch {
	case name == "evalsha" && len(args) > 1:
		script = name + " " + fmt.Sprint(args[1])
	case name == "script" && len(args) > 1:
		name += " " + strings.ToLower(fmt.Sprint(args[1]))
		if name == "script load" && len(args) > 2 {
			sum := sha1.Sum([]byte(fmt.Sprint(args[2])))
			script = name + " " + hex.EncodeToString(sum[:])
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counts == nil {
		h.counts = map[string]int{}
	}
	h.names = append(h.names, name)
	if name == "evalsha" && len(args) > 2 {
		h.numKeys = append(h.numKeys, args[2])
	}
	h.counts[name]++
	if script != "" {
		h.counts[script]++
	}
	for _, r := range requestsOf(args) {
		h.counts["requests "+r.alg]++
		if r.op == string(wire.OpAllow) || r.op == string(wire.OpCharge) {
			h.sources = append(h.sources, r.source)
		}
	}
}

// sentRequest is one decision request an EVALSHA of the decision script
// carries: its algorithm, op and config source.
type sentRequest struct{ alg, op, source string }

// decisionScripts are the SHAs of the scripts that take decision requests:
// the decision script, and the lean one of each algorithm.
var decisionScripts = func() map[any]bool {
	shas := map[any]bool{scripts.Decide.SHA: true}
	for _, s := range scripts.Lean {
		shas[s.SHA] = true
	}
	return shas
}()

// requestsOf lists the requests an EVALSHA of a decision script carries,
// in the framing internal/wire declares. commandLog counts them as
// "requests <algorithm>".
func requestsOf(args []any) []sentRequest {
	if len(args) < 3 || args[0] != "evalsha" || !decisionScripts[args[1]] {
		return nil
	}
	n, _ := args[2].(int)
	var sent []sentRequest
	for i := 3 + n; i+wire.RequestHead <= len(args); {
		alg, _ := args[i].(string)
		op, _ := args[i+1].(string)
		na, _ := args[i+3].(int)
		source := ""
		if na >= wire.ArgConfig {
			source, _, _ = strings.Cut(fmt.Sprint(args[i+wire.RequestHead+wire.ArgConfig-1]), " ")
		}
		sent = append(sent, sentRequest{alg, op, source})
		i += wire.RequestHead + na
	}
	return sent
}

func (h *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.record(cmd)
		if h.twice && cmd.Name() == "evalsha" {
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (h *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.record(cmd)
		}
		return next(ctx, cmds)
	}
}

// count returns how many commands called name (or running the script name
// says) were asked for.
func (h *commandLog) count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[name]
}

// keysSent returns each EVALSHA's count of keys, in order, and forgets them.
func (h *commandLog) keysSent() []any {
	h.mu.Lock()
	defer h.mu.Unlock()
	sent := h.numKeys
	h.numKeys = nil
	return sent
}

// sourcesSent returns each decision's config source, in order, and forgets them.
func (h *commandLog) sourcesSent() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	sent := h.sources
	h.sources = nil
	return sent
}

// sent returns the names of the commands asked for, in order.
func (h *commandLog) sent() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.names...)
}

// hammer calls f from goroutines goroutines at once, each in a loop with its
// index g and its count of calls n, until f says stop or ctx ends. wait
// waits for them all.
func hammer(ctx context.Context, goroutines int, f func(g, n int) (stop bool)) (wait func()) {
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				if f(g, n) {
					return
				}
			}
		})
	}
	return wg.Wait
}

// parseResult reads a decision's reply as a handle with default dflt does.
func parseResult(reply any, dflt Config) (Result, error) {
	var rates []wire.Rate
	if dflt.Rate > 0 {
		rates = rateList(dflt.rates())
	}
	d, ok := wire.ParseDecision(reply, rates, false)
	if !ok {
		return Result{}, unexpected(reply)
	}
	return resultOf(d), nil
}

// loadScripts loads every script on rdb's server(s), so that a test's
// count of calls meets no NOSCRIPT.
func loadScripts(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	for _, s := range scripts.All() {
		require.NoError(t, rdb.ScriptLoad(context.Background(), s.Source).Err())
	}
}

// infoValue returns one field of INFO section ("" if absent); for errorstats
// and commandstats, the "count=…"/"calls=…" text.
func infoValue(t *testing.T, rdb *redis.Client, section, field string) string {
	t.Helper()
	info, err := rdb.Info(context.Background(), section).Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// clearOfHourEdge waits, if need be, until the next 30 s do not cross a whole
// hour: a fixed window of an hour starts afresh there, which would add a
// limit's worth of grants to a test that counts them.
func clearOfHourEdge(t *testing.T) {
	now := time.Now()
	if edge := now.Truncate(time.Hour).Add(time.Hour); edge.Sub(now) < 30*time.Second {
		t.Logf("waiting %v for the hour to turn", edge.Sub(now).Round(time.Millisecond))
		time.Sleep(edge.Sub(now) + 100*time.Millisecond)
	}
}
