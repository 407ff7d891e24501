package redlimit

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// script is one algorithm's Lua: a header describing it, then
// scripts/common.lua and scripts/admin.lua with the sections of the
// algorithm's own file pasted in. It is the only place that talks to Redis.
type script struct {
	name   string
	src    string
	sha    string
	shaArg any // sha, boxed once: an EVALSHA's argument
	// nameArg is name, boxed once: a batch's requests name their algorithm.
	nameArg any
}

// newScript assembles the script of a, whose sections are in file.
func newScript(a algorithm, file string) *script {
	header := header(a)
	// A decision reads only the config fields its algorithm uses: each
	// field read costs about as much as a small command.
	own := "--[[@own_config]]\n"
	if a.burst {
		own += ", 'burst'\n"
	} else if a.buckets {
		own += ", 'buckets'\n"
	} else if a.calendar {
		own += ", 'calendar'\n"
	}
	tools := "--[[@tools]]\n" + readScript("tools.lua")
	src := paste(header+readScript("common.lua")+readScript("admin.lua"), readScript(file)+own+replies()+tools)
	return scriptOf(a.name, src)
}

// header declares what an algorithm's script knows of Go: what every
// script shares (sharedHeader), then the algorithm (see scripts/common.lua)
// and where its keys are, so that neither side types the other's numbers
// again.
func header(a algorithm) string {
	return sharedHeader() + algorithmHeader(a)
}

// sharedHeader declares the arguments' positions (call.go's arg constants)
// and config.go's bounds. The batch script declares them once, for all the
// algorithms it holds.
func sharedHeader() string {
	suffixes := make([]string, maxRates)
	for i := range suffixes {
		if i > 0 {
			suffixes[i] = strconv.Itoa(i + 1)
		}
	}
	return fmt.Sprintf("-- Declared by script.go's header, from Go.\n"+
		"local OP, NOW, PERMITS, CONFIG, CALENDAR, ID, LOG_WINDOW, CLIENT_ID, OTHERS = %d, %d, %d, %d, %d, %d, %d, %d, %d -- ARGV's\n"+
		"local MAX_RATES, DEFAULT_BUCKETS, MAX_BUCKETS = %d, %d, %d\n"+
		"local RATE_SUFFIX = { '%s' } -- a rate's state fields' suffix, by its place in the config\n"+
		"local REPLY_REMAINING = { %s = %d, %s = %d } -- a reply's remaining, by its kind: the nth number after it\n",
		argOp, argNow, argPermits, argConfig, argCalendar, argID, argLogWindow, argClientID, argOthers,
		maxRates, defaultBuckets, maxBuckets, strings.Join(suffixes, "', '"),
		replyHash, replyRemaining+1, replyDefault, slices.Index(defaultReply[:], replyRemaining)+1)
}

// algorithmHeader declares the algorithm and the positions of its keys.
func algorithmHeader(a algorithm) string {
	return fmt.Sprintf("local ALGORITHM, N, IN_CONFIG, RECORDS, BURST, BUCKETS, CALENDAR_RATES = '%s', %d, %t, %t, %t, %t, %t\n"+
		"local REGISTRY, REQUESTS = %d, %d -- KEYS': the client registry, the request log\n",
		a.name, len(a.state), a.inConfig, a.records, a.burst, a.buckets, a.calendar, a.registry(), a.registry()+1)
}

// replies writes a decision's replies from call.go's declaration of them
// (hashReply, defaultReply), as sections for common.lua's reply markers:
// each kind with one rate, and with several (the bound, and for a hash
// reply the further rates, follow).
func replies() string {
	var defaults []string
	for _, field := range defaultReply {
		defaults = append(defaults, hashReply[field])
	}
	format := func(section, kind string, fields []string, more bool) string {
		spec, rest := strings.Repeat(" %d", len(fields)), ""
		if more {
			spec, rest = spec+" ", " .. more"
		}
		return fmt.Sprintf("--[[@%s]]\nstring.format('%s%s', %s)%s\n", section, kind, spec, strings.Join(fields, ", "), rest)
	}
	return format("reply_hash", replyHash, hashReply[:replyBound], false) +
		format("reply_hash_rates", replyHash, hashReply[:], true) +
		format("reply_default", replyDefault, defaults[:len(defaults)-1], false) +
		format("reply_default_rates", replyDefault, defaults, false)
}

func scriptOf(name, src string) *script {
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	return &script{name: name, src: src, sha: sha, shaArg: sha, nameArg: name}
}

// The lines of common.lua that begin and end what a batch's script holds
// once per algorithm: the decision and what it uses.
const batchBegins, batchEnds = "-- >>>", "-- <<<"

// newBatchScript assembles scripts/batch.lua over the decisions of algs:
// common.lua's start (the call's clock), then, for each algorithm, a
// function making its decide from its header and the part of its script
// that the batch markers enclose.
func newBatchScript(algs ...algorithm) *script {
	common := readScript("common.lua")
	var b strings.Builder
	b.WriteString(sharedHeader())
	b.WriteString(common[:strings.Index(common, batchBegins)])
	b.WriteString("local makers = {}\n")
	for _, a := range algs {
		src := a.script.src
		begin, end := strings.Index(src, batchBegins), strings.Index(src, batchEnds)
		fmt.Fprintf(&b, "makers['%s'] = function()\n%s%s\nreturn decide\nend\n\n", a.name, algorithmHeader(a), src[begin:end])
	}
	b.WriteString(readScript("batch.lua"))
	return scriptOf("batch", b.String())
}

func readScript(name string) string {
	b, err := scriptFiles.ReadFile("scripts/" + name)
	if err != nil {
		panic(err) // embedded at build time: cannot happen
	}
	return string(b)
}

// paste puts each section of an algorithm's file (the lines after a line
// --[[@name]], up to the next such line) where the skeleton names it with
// --[[@name]], on a line of its own or within one. The steps of a config's
// further rates, more_load and the like, are the first rate's (load, …)
// unless the file has sections of their own. A section without a place, or
// a place without a section, is a mistake in the scripts: newScript runs as
// the package starts, so it panics then.
func paste(skeleton, algorithm string) string {
	sections := map[string]string{}
	name := ""
	for line := range strings.Lines(algorithm) {
		if marker, ok := strings.CutPrefix(strings.TrimSpace(line), "--[[@"); ok && strings.HasSuffix(marker, "]]") {
			name = strings.TrimSuffix(marker, "]]")
			sections[name] = ""
		} else if name != "" {
			sections[name] += line
		}
	}
	for _, step := range []string{"decode", "load", "wait", "commit", "encode", "write", "report", "release"} {
		if _, ok := sections["more_"+step]; !ok && strings.Contains(skeleton, "--[[@more_"+step+"]]") {
			sections["more_"+step] = sections[step]
		}
	}
	for name, text := range sections {
		marker := "--[[@" + name + "]]"
		if !strings.Contains(skeleton, marker) {
			panic("redlimit: no place for section " + marker)
		}
		// A banner names the section where it starts, for a reader of the
		// assembled script (scripts/assembled): a block comment, as some
		// places are within a line.
		skeleton = strings.ReplaceAll(skeleton, marker, "--[[ "+name+" ]] "+strings.TrimRight(text, "\n"))
	}
	if at := strings.Index(skeleton, "--[[@"); at >= 0 {
		panic("redlimit: no section for " + skeleton[at:at+strings.IndexByte(skeleton[at:], ']')+2])
	}
	return skeleton
}

// run executes s: the one road from every method to Redis. With WithBreaker,
// the breaker may answer instead, and learns from the outcome.
func (c *Client) run(ctx context.Context, s *script, keys, args []any) (any, error) {
	return c.runDeciding(ctx, 1, s, keys, args)
}

// runDeciding is run for a call that holds decisions requests: the
// breaker counts each.
func (c *Client) runDeciding(ctx context.Context, decisions int, s *script, keys, args []any) (any, error) {
	pass, err := c.breaker.enter()
	if err != nil {
		return nil, err
	}
	reply, err := c.evalSha(ctx, s, keys, args)
	c.breaker.leave(pass, err, decisions)
	return reply, err
}

// evalSha runs s with EVALSHA. A server without it (restarted, failed over,
// SCRIPT FLUSH, a new Cluster node: the script cache is neither persisted nor
// replicated) answers NOSCRIPT; evalSha then has it loaded (reload) and tries
// again. With several servers (Cluster shards, Ring) caches empty at
// different moments, so a retry can meet NOSCRIPT again, from a server that
// lost the script after the load it waited for: each such answer gets a load
// of its own, up to maxScriptRuns EVALSHAs in all.
func (c *Client) evalSha(ctx context.Context, s *script, keys, args []any) (any, error) {
	sent := time.Now()
	reply, err := c.send(ctx, s, keys, args)
	for runs := 1; isNoScript(err) && runs < maxScriptRuns; runs++ {
		answered := time.Now()
		if err := c.reload(ctx, s, sent, answered, runs > 1); err != nil {
			return nil, fmt.Errorf("%w (loading script %s)", scriptError(ctx, err, keys), s.name)
		}
		sent = time.Now()
		reply, err = c.send(ctx, s, keys, args)
	}
	if err != nil {
		return nil, s.namingCommand(err, scriptError(ctx, err, keys))
	}
	return reply, nil
}

// userScriptLine finds the line of s.src that Redis names in a script's
// error: "on @user_script:112." (7.0), "@user_script: 112:" (6.2).
var userScriptLine = regexp.MustCompile(`@user_script: ?(\d+)`)

// scriptCommand finds the command a line of a script runs.
var scriptCommand = regexp.MustCompile(`redis\.p?call\('([A-Z]+)'`)

// namingCommand adds to an ACL refusal the command refused, where Redis
// names only the script's line (7.0 and 6.2; 7.2 and later name the
// command): the command on that line, or on the two before it, where a
// pcall's error is raised. A refusal met inside a helper that takes the
// command as an argument stays as Redis said it (its ACL LOG names it).
func (s *script) namingCommand(raw, err error) error {
	if !errors.Is(err, ErrMisconfigured) || strings.Contains(err.Error(), "may not run") {
		return err
	}
	m := userScriptLine.FindStringSubmatch(raw.Error())
	if m == nil {
		return err
	}
	n, _ := strconv.Atoi(m[1])
	lines := strings.Split(s.src, "\n")
	for i := n; i >= n-2 && i >= 1 && i <= len(lines); i-- {
		if c := scriptCommand.FindStringSubmatch(lines[i-1]); c != nil {
			return fmt.Errorf("%w (the script's line %d runs %s: the ACL user may not run it)", err, n, c[1])
		}
	}
	return err
}

// send sends one EVALSHA of s. go-redis's EvalSha boxes the sha and every
// key on each call, an allocation each; the limiter's keys and the sha are
// boxed once, so send builds the command itself when the client can process
// one (every go-redis client can: Client, ClusterClient, Ring,
// AutoPipeliner), routed by its first key as EvalSha routes it.
func (c *Client) send(ctx context.Context, s *script, keys, args []any) (any, error) {
	p, ok := c.rdb.(interface {
		Process(context.Context, redis.Cmder) error
	})
	if !ok {
		names := make([]string, len(keys))
		for i, k := range keys {
			names[i] = k.(string)
		}
		return c.rdb.EvalSha(ctx, s.sha, names, args...).Result()
	}
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(append(append(cmdArgs, "evalsha", s.shaArg, len(keys)), keys...), args...)
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
func (c *Client) reload(ctx context.Context, s *script, sent, answered time.Time, again bool) error {
	v, _ := c.loads.LoadOrStore(s, &scriptLoad{})
	l := v.(*scriptLoad)
	l.mu.Lock()
	defer l.mu.Unlock()
	if (!again && l.done.After(sent)) || (again && l.began.After(answered)) {
		return nil
	}
	began := time.Now()
	if err := s.load(ctx, c.rdb); err != nil {
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
func (s *script) load(ctx context.Context, rdb redis.Scripter) error {
	if ring, ok := rdb.(*redis.Ring); ok {
		return ring.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
			return shard.ScriptLoad(ctx, s.src).Err()
		})
	}
	return rdb.ScriptLoad(ctx, s.src).Err()
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
		return ErrMisconfigured
	case strings.HasPrefix(msg, "WRONGTYPE"):
		return ErrCorruptState
	}
	return ErrUnavailable
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

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// scriptError maps an error of a call on keys to the package's sentinels.
//
// Redis answered with an error: replyKind says what it is, or, for the
// scripts' own "REDLIMIT <kind> <detail>", the kind: ErrNotInitialized,
// ErrAlgorithmMismatch or ErrCorruptState ("corrupt <key>: <what>"). A
// script that met an error of Redis on one of its keys reports it as
// "corrupt <key>: <the error>"; that error is classed by replyKind too, so
// that a full Redis (OOM) is an outage and an ACL refusal a misconfiguration
// wherever the script met it, not corrupt state.
//
// Redis did not answer: the caller's own cancellation is not an outage, and
// the error wraps context.Canceled and the cause only; anything else
// (unreachable, timed out, a deadline that passed first) is ErrUnavailable
// with the cause, and the context's error if it ended, so that errors.Is
// finds each and WithFailOpen applies.
func scriptError(ctx context.Context, err error, keys []any) error {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		ctxErr := ctx.Err()
		switch {
		case errors.Is(ctxErr, context.Canceled) && errors.Is(err, ctxErr):
			return fmt.Errorf("redlimit: %w", err)
		case errors.Is(ctxErr, context.Canceled):
			return fmt.Errorf("redlimit: %w: %w", ctxErr, err)
		case ctxErr != nil && !errors.Is(err, ctxErr):
			return fmt.Errorf("%w: %w: %w", ErrUnavailable, ctxErr, err)
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	// Redis answers "ERR REDLIMIT … script: <sha>, on @user_script:<line>.",
	// miniredis "ERR Error compiling script (new function): REDLIMIT … stack traceback: …".
	_, detail, ours := strings.Cut(rerr.Error(), "REDLIMIT ")
	if !ours {
		return fmt.Errorf("%w: %w", replyKind(rerr.Error()), err)
	}
	detail = withoutTrailer(detail)
	// One statement after the sentinel's: the detail loses the kind word.
	kind, detail, _ := strings.Cut(detail, " ")
	switch kind {
	case "not": // "not initialized <key>"
		return fmt.Errorf("%w: %s holds no config and the handle has no default (WithDefault)",
			ErrNotInitialized, strings.TrimPrefix(detail, "initialized "))
	case "algorithm": // "algorithm <key> holds a <name> config, not <name>"
		return fmt.Errorf("%w: %s; Delete it to use the name with another algorithm", ErrAlgorithmMismatch, detail)
	case "clock": // "clock at <ms> is outside the calendar windows …"
		return fmt.Errorf("%w: Redis's %s", ErrClockSkew, detail)
	}
	// "corrupt <key>: <what>", where what may be an error of Redis.
	if key, reply, ok := keyReply(detail, keys); ok {
		switch replyKind(reply) {
		case ErrUnavailable:
			return fmt.Errorf("%w: %w (on %s)", ErrUnavailable, replyError(reply), key)
		case ErrMisconfigured:
			return misconfigured(key, reply)
		}
	}
	return fmt.Errorf("%w: %s", ErrCorruptState, detail)
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
		// tools.lua's call names the command it ran: "… (ZRANGE)".
		command, reply = m[2], m[1]
	}
	if command != "" {
		return fmt.Errorf("%w: the ACL user may not run %s, which the scripts run on %s: %w",
			ErrMisconfigured, strings.ToUpper(command), key, replyError(reply))
	}
	return fmt.Errorf("%w: refused on %s (ACL LOG names the command): %w", ErrMisconfigured, key, replyError(reply))
}

// calledCommand splits an error reply passed on by tools.lua's call from
// the command it names.
var calledCommand = regexp.MustCompile(`^(.*) \(([A-Z]+)\)$`)

// replyError is an error reply of Redis that a script met and passed on in
// its own error: the cause, as go-redis would have given it.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}
