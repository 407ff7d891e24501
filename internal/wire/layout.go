package wire

import (
	"slices"
	"strings"
)

// The key layout read backwards, for the operator's tools (cmd/redlimit):
// from a key SCAN returns to its limiter, and from what a limiter's key
// holds to the algorithm that wrote it. The library only writes the layout
// (keys.go, wire.go); its inverses live here, beside it, so that a change
// to one is a change to both.

// The fields of an in-flight limit's config hash (scripts/inflight.lua),
// whose FieldAlgorithm holds InFlightAlgorithm.
const (
	FieldLimit = "limit"
	FieldTTL   = "ttl" // ms
)

// Suffixes are the suffixes a limiter's other keys add after its name:
// every algorithm's state keys', the registry's, the request log's and an
// in-flight limit's holds'.
func Suffixes() []string {
	all := []string{SuffixClients, SuffixRequests, SuffixHolders}
	for _, a := range Algorithms {
		for _, s := range a.State {
			if !slices.Contains(all, s) {
				all = append(all, s)
			}
		}
	}
	return all
}

// LimiterKey is KeyOf's inverse: the limiter key full whose key suffix is
// key, or false when key is no such key.
func LimiterKey(key, suffix string) (full string, ok bool) {
	base, ok := strings.CutSuffix(key, ":"+suffix)
	if !ok {
		return "", false
	}
	if inner, ok := strings.CutPrefix(base, "{"); ok && strings.HasSuffix(inner, "}") && KeyOf(inner[:len(inner)-1], suffix) == key {
		return inner[:len(inner)-1], true
	}
	return base, KeyOf(base, suffix) == key
}

// NameOf is FullName's inverse: the name of the limiter whose key is key
// under prefix, or false when key cannot be a limiter's own key: outside
// the prefix, or another key of a limiter (prefix{name}:suffix, which a
// name could not give: a PerClient hash such as :tat:<client> looks like a
// funnel's).
func NameOf(prefix, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok || rest == "" || isSuffixKey(key) {
		return "", false
	}
	// prefix{name} names name; a name that holds a tag keeps it as it is.
	if inner, ok := strings.CutPrefix(rest, "{"); ok && strings.HasSuffix(inner, "}") {
		if name := inner[:len(inner)-1]; FullName(prefix, name) == key {
			return name, true
		}
	}
	return rest, FullName(prefix, rest) == key
}

// isSuffixKey reports whether key is name:suffix for a name with a hash
// tag: after the tag, a ':' and one of the Suffixes, alone or before a ':'.
func isSuffixKey(key string) bool {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return false
	}
	closing := strings.IndexByte(key[open:], '}')
	if closing < 0 {
		return false
	}
	rest := key[open+closing+1:]
	suffixes := Suffixes()
	for i := 0; i < len(rest); i++ {
		if rest[i] != ':' {
			continue
		}
		for _, s := range suffixes {
			if after, ok := strings.CutPrefix(rest[i+1:], s); ok && (after == "" || after[0] == ':') {
				return true
			}
		}
	}
	return false
}

// HashOwner names the algorithm whose hash at a limiter's key holds the
// fields field reads (value, whether present), as the admin script tells
// them: a config is there when its rate, interval or algorithm is, and
// its algorithm is the algorithm field's, or the token bucket's without
// one (Redisson's layout); with no config, the algorithm whose Overall
// state fields it holds (Throttle's funnel, or state a default wrote before
// a config). It returns "" for a hash no algorithm wrote. An in-flight
// limit's hash names InFlightAlgorithm.
func HashOwner(field func(name string) (string, bool)) (algorithm string, config bool) {
	_, rate := field(FieldRate)
	_, interval := field(FieldInterval)
	alg, named := field(FieldAlgorithm)
	switch {
	case named:
		return alg, true
	case rate || interval:
		return TokenBucket.Name, true
	}
	for _, a := range Algorithms {
		for _, f := range a.Fields {
			if _, ok := field(f); ok {
				return a.Name, false
			}
		}
	}
	return "", false
}

// FlatFields reads a's flat state (with no config stored, the Overall
// state's fields as one string: each rate's values space-separated, ';'
// between rates) as the hash fields it stands for, each rate's suffixed
// with its RateSuffix, as the admin script reads it; false when value has
// another shape. A marker (a's name) stands for no field.
func (a *Algorithm) FlatFields(value string) (map[string]string, bool) {
	fields := map[string]string{}
	if value == a.Name {
		return fields, true
	}
	if strings.Trim(value, "0123456789:, ;") != "" {
		return nil, false
	}
	parts := strings.Split(value, ";")
	if len(parts) > MaxRates {
		return nil, false
	}
	for k, part := range parts {
		pieces := strings.Fields(part)
		if len(pieces) != 0 && len(pieces) != len(a.Fields) {
			return nil, false
		}
		for i, piece := range pieces {
			fields[a.Fields[i]+RateSuffix(k)] = piece
		}
	}
	return fields, true
}
