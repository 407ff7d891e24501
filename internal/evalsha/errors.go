package evalsha

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/wire"
)

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
