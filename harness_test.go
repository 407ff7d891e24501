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

	"github.com/redis/go-redis/v9"
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
		// evalsha sha numkeys keys... then the scripts' arguments (argOp …).
		if n, ok := args[2].(int); ok && len(args) > 2+n+argConfig && (args[2+n+argOp] == "allow" || args[2+n+argOp] == "release") {
			source, _, _ := strings.Cut(fmt.Sprint(args[2+n+argConfig]), " ")
			h.sources = append(h.sources, source)
		}
	}
	h.counts[name]++
	if script != "" {
		h.counts[script]++
	}
	for _, alg := range requestsOf(args) {
		h.counts["requests "+alg]++
	}
}

// scriptsByAlgorithm maps each algorithm's script to its name.
var scriptsByAlgorithm = map[string]string{
	tokenBucket.script.sha: tokenBucket.name, funnel.script.sha: funnel.name,
	fixedWindow.script.sha: fixedWindow.name, slidingWindow.script.sha: slidingWindow.name,
}

// requestsOf lists the algorithm of each request an EVALSHA's args carry:
// one for an algorithm's script, each of a batch's. commandLog counts them
// as "requests <algorithm>".
func requestsOf(args []any) []string {
	if len(args) < 3 || args[0] != "evalsha" {
		return nil
	}
	sha, _ := args[1].(string)
	if alg, ok := scriptsByAlgorithm[sha]; ok {
		return []string{alg}
	}
	n, _ := args[2].(int)
	if sha != batchScript.sha || len(args) < 3+n+2 {
		return nil
	}
	var algs []string
	for i := 3 + n + 2; i+2 < len(args); {
		alg, _ := args[i].(string)
		na, _ := args[i+2].(int)
		algs = append(algs, alg)
		i += 3 + na
	}
	return algs
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
