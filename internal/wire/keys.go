package wire

import (
	"fmt"
	"strings"
)

// The key layout. A limiter's keys all start with the Client's prefix (for
// ACL key patterns and SCAN MATCH) and share one Cluster slot: the name
// carries a hash tag, prefix{name}, and each other key is the name and a
// suffix, {name}:suffix as Redisson names them, or name:suffix when the name
// holds its tag already.
const (
	SuffixClients  = "clients"  // the client registry: zset of PerClient ids, score = last grant in ms
	SuffixRequests = "requests" // the request log: zset of request ids, score = when forgotten in ms
	SuffixHolders  = "holders"  // an in-flight limit's holds: zset of hold ids, score = expiry in ms
)

// FullName puts the hash tag inside the prefix: prefix{name}. A name that
// holds a tag already keeps it, and without a prefix the name stays as it
// is, as Redisson names it.
func FullName(prefix, name string) string {
	if prefix == "" || strings.Contains(prefix+name, "{") {
		return prefix + name
	}
	return prefix + "{" + name + "}"
}

// CheckedName is FullName(prefix, name), and an error wrapping
// ErrInvalidName unless it gives keys that share one Cluster slot: its
// first '{', if any, opens a non-empty hash tag. The error speaks of the
// braces the caller wrote, not of those FullName added.
func CheckedName(prefix, name string) (string, error) {
	full := FullName(prefix, name)
	if name == "" {
		return full, fmt.Errorf("%w: empty", ErrInvalidName)
	}
	open := strings.IndexByte(full, '{')
	if open < 0 || strings.IndexByte(full[open:], '}') > 1 {
		return full, nil
	}
	if !strings.Contains(prefix+name, "{") {
		// FullName made the tag, prefix{name}, and name closed it at once.
		return full, fmt.Errorf("%w: %q: under a prefix a name cannot start with '}': its keys are named %q…, whose \"{}\" is no hash tag",
			ErrInvalidName, name, full)
	}
	return full, fmt.Errorf("%w: %q: a '{' must open a non-empty hash tag", ErrInvalidName, full)
}

// KeyOf follows Redisson: {name}:suffix, or name:suffix when name already
// has a hash tag, so that all of a limiter's keys share one Cluster slot.
func KeyOf(name, suffix string) string {
	if strings.Contains(name, "{") {
		return name + ":" + suffix
	}
	return "{" + name + "}:" + suffix
}

// StateKeys are a's state keys for one client of the limiter full, or the
// Overall state's for client "".
func (a *Algorithm) StateKeys(full, client string) []string {
	keys := make([]string, len(a.State))
	for i, s := range a.State {
		if client != "" {
			s += ":" + client
		}
		keys[i] = KeyOf(full, s)
	}
	return keys
}

// Keys are a decision's whole key list for client, in the positions
// KeyLimiter, Registry and Requests name: the limiter's key, the Overall
// state's keys unless InConfig, the registry, the request log, the client's
// state keys.
func (a *Algorithm) Keys(full, client string) []string {
	keys := []string{full}
	if !a.InConfig {
		keys = append(keys, a.StateKeys(full, "")...)
	}
	keys = append(keys, KeyOf(full, SuffixClients), KeyOf(full, SuffixRequests))
	return append(keys, a.StateKeys(full, client)...)
}
