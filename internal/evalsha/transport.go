package evalsha

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/wire"
)

// Transport runs scripts on one go-redis client.
type Transport struct {
	rdb     redis.Scripter
	scripts Scripts
	loads   sync.Map // *Script → *scriptLoad, see reload
	breaker *Breaker // nil: none
	batches batches
}

// Options are how a Transport sends.
type Options struct {
	Breaker *Breaker // fail fast while Redis is down; nil for none
	NoBatch bool     // every decision in a call of its own
}

// NewTransport makes a Transport running scripts on rdb.
func NewTransport(rdb redis.Scripter, scripts Scripts, opts Options) *Transport {
	t := &Transport{rdb: rdb, scripts: scripts, breaker: opts.Breaker}
	t.batches.route(rdb, opts.NoBatch)
	return t
}

// Run runs s once on keys and args: an op that is no decision (the admin
// and in-flight scripts). With a breaker, the breaker may answer instead,
// and learns from the outcome.
func (t *Transport) Run(ctx context.Context, s *Script, keys, args []any) (any, error) {
	return t.run(ctx, 1, s, keys, nil, args)
}

// run is Run for a call that holds decisions requests: the breaker counts
// each. head goes before args: a lone decision's request head.
func (t *Transport) run(ctx context.Context, decisions int, s *Script, keys, head, args []any) (any, error) {
	if err := ctx.Err(); err != nil {
		// Not sent: the breaker learns nothing. A deadline that passed
		// while the call waited for its batch is an outage, as one that
		// passes while Redis does not answer.
		return nil, Classify(ctx, err, keys)
	}
	pass, err := t.breaker.enter()
	if err != nil {
		return nil, err
	}
	reply, err := t.evalSha(ctx, s, keys, head, args)
	t.breaker.leave(pass, err, decisions)
	return reply, err
}

// evalSha runs s with EVALSHA. A server without it (restarted, failed over,
// SCRIPT FLUSH, a new Cluster node: the script cache is neither persisted nor
// replicated) answers NOSCRIPT; evalSha then has it loaded (reload) and tries
// again. With several servers (Cluster shards, Ring) caches empty at
// different moments, so a retry can meet NOSCRIPT again, from a server that
// lost the script after the load it waited for: each such answer gets a load
// of its own, up to maxScriptRuns EVALSHAs in all.
func (t *Transport) evalSha(ctx context.Context, s *Script, keys, head, args []any) (any, error) {
	sent := time.Now()
	reply, err := t.send(ctx, s, keys, head, args)
	for runs := 1; isNoScript(err) && runs < maxScriptRuns; runs++ {
		answered := time.Now()
		if err := t.reload(ctx, s, sent, answered, runs > 1); err != nil {
			return nil, fmt.Errorf("%w (loading script %s)", Classify(ctx, err, keys), s.Name)
		}
		sent = time.Now()
		reply, err = t.send(ctx, s, keys, head, args)
	}
	if err != nil {
		return nil, s.namingCommand(err, Classify(ctx, err, keys))
	}
	return reply, nil
}

// send sends one EVALSHA of s. go-redis's EvalSha boxes the sha and every
// key on each call, an allocation each; a limiter's keys and the sha are
// boxed once, so send builds the command itself when the client can process
// one (every go-redis client can: Client, ClusterClient, Ring,
// AutoPipeliner), routed by its first key as EvalSha routes it.
func (t *Transport) send(ctx context.Context, s *Script, keys, head, args []any) (any, error) {
	p, ok := t.rdb.(interface {
		Process(context.Context, redis.Cmder) error
	})
	if !ok {
		names := make([]string, len(keys))
		for i, k := range keys {
			names[i] = k.(string)
		}
		return t.rdb.EvalSha(ctx, s.SHA, names, append(append([]any(nil), head...), args...)...).Result()
	}
	cmdArgs := make([]any, 0, 3+len(keys)+len(head)+len(args))
	cmdArgs = append(append(append(append(cmdArgs, "evalsha", s.shaArg, len(keys)), keys...), head...), args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	cmd.SetFirstKeyPos(3)
	_ = p.Process(ctx, cmd)
	return cmd.Result()
}

// maxScriptRuns bounds the EVALSHAs of one call. Every NOSCRIPT after the
// first means a server emptied its cache again after a load sent for this
// call: a call still meeting NOSCRIPT after this many ends with ErrUnavailable.
const maxScriptRuns = 5

// reload loads s once for all the callers that met NOSCRIPT together. The
// caller's EVALSHA was sent at sent and answered NOSCRIPT at answered.
//
// On a first NOSCRIPT, a load that completed after sent is taken as the cure:
// the EVALSHA may have reached the server before that load did, and this is
// what keeps it to one SCRIPT LOAD per flush for any number of callers. That
// guess is wrong when the server lost the script again after the load reached
// it (another flush, a restart, a failover): the retry then meets NOSCRIPT
// and comes back with again set. Then only a load begun after answered
// counts, as it reaches every server after whatever emptied this one.
func (t *Transport) reload(ctx context.Context, s *Script, sent, answered time.Time, again bool) error {
	v, _ := t.loads.LoadOrStore(s, &scriptLoad{})
	l := v.(*scriptLoad)
	l.mu.Lock()
	defer l.mu.Unlock()
	if (!again && l.done.After(sent)) || (again && l.began.After(answered)) {
		return nil
	}
	began := time.Now()
	if err := s.load(ctx, t.rdb); err != nil {
		return err
	}
	l.began, l.done = began, time.Now()
	return nil
}

type scriptLoad struct {
	mu          sync.Mutex
	began, done time.Time // the last load that succeeded: when it was sent, when every server had answered
}

// load sends SCRIPT LOAD. ClusterClient sends it to every shard itself; a Ring
// sends it to one, so each shard gets its own.
func (s *Script) load(ctx context.Context, rdb redis.Scripter) error {
	if ring, ok := rdb.(*redis.Ring); ok {
		return ring.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
			return shard.ScriptLoad(ctx, s.Source).Err()
		})
	}
	return rdb.ScriptLoad(ctx, s.Source).Err()
}

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// namingCommand adds to an ACL refusal the command refused, where Redis
// names only the script's line (7.0 and 6.2; 7.2 and later name the
// command): the command on that line, or on the two before it, where a
// pcall's error is raised. A refusal met inside a helper that takes the
// command as an argument stays as Redis said it (its ACL LOG names it).
func (s *Script) namingCommand(raw, err error) error {
	if !errors.Is(err, wire.ErrMisconfigured) || strings.Contains(err.Error(), "may not run") {
		return err
	}
	if line, command := s.commandAt(raw.Error()); command != "" {
		return fmt.Errorf("%w (the script's line %d runs %s: the ACL user may not run it)", err, line, command)
	}
	return err
}

// replyKind is the sentinel for an error reply of Redis, by its kind: the
// one place that says which replies are outages, which a refusal only an
// operator can fix, and which a key holding what the scripts never write.
//   - ErrMisconfigured (misconfiguredReply): NOPERM, NOAUTH, an ACL refusal
//     inside a script, an unknown command...; never failed open.
//   - ErrCorruptState: WRONGTYPE, a key of the limiter holding another type.
//   - ErrUnavailable: anything else (LOADING, OOM, BUSY, READONLY, MASTERDOWN,
//     NOSCRIPT still...), which a retry or a wait can cure.
func replyKind(msg string) error {
	switch {
	case misconfiguredReply(msg):
		return wire.ErrMisconfigured
	case strings.HasPrefix(msg, "WRONGTYPE"):
		return wire.ErrCorruptState
	}
	return wire.ErrUnavailable
}

// misconfiguredReply reports whether Redis refused the call for a reason
// only its operator can fix: an ACL that does not cover the limiter's keys or
// commands, a wrong or missing password, a disabled or renamed command (a
// managed Redis without scripting), a database that does not exist.
func misconfiguredReply(msg string) bool {
	// CROSSSLOT: a limiter's keys in several Cluster slots, which only a
	// name can cause ('}' without '{'), and no wait cures.
	for _, prefix := range []string{"NOPERM", "NOAUTH", "WRONGPASS", "ERR unknown command", "ERR unknown subcommand", "ERR DB index is out of range", "CROSSSLOT"} {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	// ACL refusals raised inside a script: Redis 7.0 says "The user executing
	// the script can't …", 7.2 and later "ACL failure in script: …".
	return strings.Contains(msg, "The user executing the script can't") || strings.Contains(msg, "ACL failure in script")
}

// Classify maps an error of a call on keys to the package's sentinels.
//
// Redis answered with an error: replyKind says what it is, or, for the
// scripts' own "REDLIMIT <kind> <detail>" (internal/wire's kinds), the
// kind's. A script that met an error of Redis on one of its keys reports it
// as "corrupt <key>: <the error>"; that error is classed by replyKind too,
// so that a full Redis (OOM) is an outage and an ACL refusal a
// misconfiguration wherever the script met it, not corrupt state.
//
// Redis did not answer: the caller's own cancellation is not an outage, and
// the error wraps context.Canceled and the cause only; anything else
// (unreachable, timed out, a deadline that passed first) is ErrUnavailable
// with the cause, and the context's error if it ended, so that errors.Is
// finds each and WithFailOpen applies.
func Classify(ctx context.Context, err error, keys []any) error {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		ctxErr := ctx.Err()
		switch {
		case errors.Is(ctxErr, context.Canceled) && errors.Is(err, ctxErr):
			return fmt.Errorf("redlimit: %w", err)
		case errors.Is(ctxErr, context.Canceled):
			return fmt.Errorf("redlimit: %w: %w", ctxErr, err)
		case ctxErr != nil && !errors.Is(err, ctxErr):
			return fmt.Errorf("%w: %w: %w", wire.ErrUnavailable, ctxErr, err)
		}
		return fmt.Errorf("%w: %w", wire.ErrUnavailable, err)
	}
	// Redis answers "ERR REDLIMIT … script: <sha>, on @user_script:<line>.",
	// miniredis "ERR Error compiling script (new function): REDLIMIT … stack traceback: …".
	_, detail, ours := strings.Cut(rerr.Error(), wire.ErrorPrefix)
	if !ours {
		return fmt.Errorf("%w: %w", replyKind(rerr.Error()), err)
	}
	detail = withoutTrailer(detail)
	switch {
	case strings.HasPrefix(detail, wire.KindNotInitialized+" "):
		return fmt.Errorf("%w: %s holds no config and the handle has no default (WithDefault)",
			wire.ErrNotInitialized, strings.TrimPrefix(detail, wire.KindNotInitialized+" "))
	case strings.HasPrefix(detail, wire.KindAlgorithm+" "):
		return fmt.Errorf("%w: %s; Delete it to use the name with another algorithm", wire.ErrAlgorithmMismatch,
			strings.TrimPrefix(detail, wire.KindAlgorithm+" "))
	case strings.HasPrefix(detail, wire.KindClock+" "):
		return fmt.Errorf("%w: Redis's %s", wire.ErrClockSkew, detail)
	case strings.HasPrefix(detail, wire.KindPermits+" "):
		return fmt.Errorf("%w: %s (nothing was written)", wire.ErrInvalidPermits, strings.TrimPrefix(detail, wire.KindPermits+" "))
	}
	// "corrupt <key>: <what>", where what may be an error of Redis.
	detail = strings.TrimPrefix(detail, wire.KindCorrupt+" ")
	if key, reply, ok := keyReply(detail, keys); ok {
		switch replyKind(reply) {
		case wire.ErrUnavailable:
			return fmt.Errorf("%w: %w (on %s)", wire.ErrUnavailable, ReplyError(reply), key)
		case wire.ErrMisconfigured:
			return misconfigured(key, reply)
		}
	}
	return fmt.Errorf("%w: %s", wire.ErrCorruptState, detail)
}

// withoutTrailer cuts what Redis or miniredis append to a script's error.
func withoutTrailer(msg string) string {
	for _, trailer := range []string{" script: ", " stack traceback:"} {
		if at := strings.LastIndex(msg, trailer); at >= 0 {
			msg = msg[:at]
		}
	}
	return msg
}

// keyReply splits a corrupt detail, "<key>: <what>", into one of the call's
// keys and what, when what is an error reply of Redis: a code in capitals
// ("OOM …", "WRONGTYPE …", "NOPERM …", "ERR …"), where the scripts' own
// descriptions start in lower case, or an ACL refusal. Redis 6.2 puts the
// script's line first ("@user_script: 1: -OOM …"). The key is matched
// against the call's own, so a name holding ": OOM" cannot pass for a reply.
func keyReply(detail string, keys []any) (key, reply string, ok bool) {
	for _, k := range keys {
		name, _ := k.(string)
		rest, found := strings.CutPrefix(detail, name+": ")
		if !found || name == "" {
			continue
		}
		if line, ok := strings.CutPrefix(rest, "@user_script: "); ok {
			if _, after, ok := strings.Cut(line, ": "); ok {
				rest = strings.TrimPrefix(after, "-")
			}
		}
		if errorCode(rest) || misconfiguredReply(rest) {
			return name, rest, true
		}
	}
	return "", "", false
}

// errorCode reports whether msg starts as Redis's error replies do: a word
// of capital letters, then a space.
func errorCode(msg string) bool {
	code, _, found := strings.Cut(msg, " ")
	if !found || len(code) < 2 {
		return false
	}
	for _, r := range code {
		if r < 'A' || r > 'Z' {
			return false
		}
	}
	return true
}

// misconfigured is ErrMisconfigured for an ACL (or other) refusal a script
// met on key. Redis 7.2 and later name the command the ACL refuses ("no
// permissions to run the 'zadd' command"); 7.0 does not, and its ACL LOG
// does.
func misconfigured(key, reply string) error {
	command := ""
	if _, rest, ok := strings.Cut(reply, "run the '"); ok {
		command, _, _ = strings.Cut(rest, "' command")
	} else if m := calledCommand.FindStringSubmatch(reply); m != nil {
		// The admin script's call names the command it ran: "… (ZRANGE)".
		command, reply = m[2], m[1]
	}
	if command != "" {
		return fmt.Errorf("%w: the ACL user may not run %s, which the scripts run on %s: %w",
			wire.ErrMisconfigured, strings.ToUpper(command), key, ReplyError(reply))
	}
	return fmt.Errorf("%w: refused on %s (ACL LOG names the command): %w", wire.ErrMisconfigured, key, ReplyError(reply))
}

// calledCommand splits an error reply passed on by the admin script's call
// from the command it names.
var calledCommand = regexp.MustCompile(`^(.*) \(([A-Z]+)\)$`)

// ReplyError is an error reply of Redis that a script met and passed on in
// its own error: the cause, as go-redis would have given it.
type ReplyError string

func (e ReplyError) Error() string { return string(e) }
func (ReplyError) RedisError()     {}
