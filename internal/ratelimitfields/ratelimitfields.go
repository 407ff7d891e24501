// Package ratelimitfields formats one decision as the fields of
// draft-ietf-httpapi-ratelimit-headers, for httplimit (HTTP headers) and
// grpclimit (gRPC metadata), so that both write them by the same rules.
package ratelimitfields

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redlimit/redlimit"
)

// Name quotes a policy name as a structured-field string, and reports false
// when it is not printable ASCII (all a structured-field string may hold;
// for those, Go's quoting is the sf-string's).
func Name(policy string) (string, bool) {
	for i := 0; i < len(policy); i++ {
		if policy[i] < 0x20 || policy[i] > 0x7e {
			return "", false
		}
	}
	return strconv.Quote(policy), true
}

// Fields are one decision's items, for the policy quoted as name.
type Fields struct {
	// Policy is RateLimit-Policy's item, name;q=Limit;w=Window, or with
	// several rates its list: one item per Quota, each named by names.
	Policy string
	// Limit is RateLimit's item, name;r=Remaining;t=Seconds(Effective):
	// with several rates, the bound one's (Result.Bound). "" for a request
	// above the limit (AboveLimit).
	Limit string
	// Effective is the effective window t: until the limiter is full again
	// (ResetAfter), or on a denial the wait (RetryAfter), as the draft wants.
	Effective time.Duration
}

// Policies checks the names and limiters of a stack of policies (httplimit's
// and grpclimit's NewAll), given their names and whether each has a
// Limiter, and returns the names quoted for RateLimit fields. It panics,
// naming pkg, on a name that is not printable ASCII, a name given twice or
// a policy without a Limiter: a mistake of the program, seen as it starts.
func Policies(pkg string, names []string, hasLimiter func(i int) bool) []string {
	quoted := make([]string, len(names))
	seen := map[string]bool{}
	for i, n := range names {
		q, ok := Name(n)
		switch {
		case !ok:
			panic(fmt.Sprintf("%s: policy name %q is not printable ASCII", pkg, n))
		case seen[n]:
			panic(fmt.Sprintf("%s: two policies named %q", pkg, n))
		case !hasLimiter(i):
			panic(fmt.Sprintf("%s: policy %q has no Limiter", pkg, n))
		}
		seen[n], quoted[i] = true, q
	}
	return quoted
}

// AboveLimit reports whether r denies a request that asked for more than
// the limiter can ever grant (RetryAfter Never, ErrPermitsExceedRate): one
// that no wait lets through, answered 413 or ResourceExhausted without a
// wait.
func AboveLimit(r redlimit.Result) bool { return !r.Allowed && r.RetryAfter < 0 }

// For returns r's fields. w is left out when the decision has no Window. A
// request above the limit has its policy only: RateLimit's r and t would
// tell its client how many are left and when to come back, and no wait lets
// it through. The policy's q tells it the most it may ask for.
func For(name string, r redlimit.Result) Fields {
	policy := item(name, r.Limit, r.Window)
	if len(r.Quotas) > 1 {
		quotaNames := names(name, r.Quotas)
		items := make([]string, len(quotaNames))
		for i, q := range r.Quotas {
			items[i] = item(quotaNames[i], q.Limit, q.Window)
		}
		policy, name = strings.Join(items, ", "), quotaNames[r.Bound]
	}
	if AboveLimit(r) {
		return Fields{Policy: policy}
	}
	effective := r.ResetAfter
	if !r.Allowed {
		effective = r.RetryAfter
	} else if len(r.Quotas) > 1 {
		// ResetAfter is the slowest rate's, an hour for 10 per second and
		// 1000 per hour: t=3600 beside the per-second policy would have a
		// client spread its 9 permits over an hour. t is the bound rate's:
		// until its own window resets.
		effective = r.Quotas[r.Bound].ResetAfter
	}
	return Fields{
		Policy:    policy,
		Limit:     name + ";r=" + strconv.FormatInt(r.Remaining, 10) + ";t=" + strconv.FormatInt(Seconds(effective), 10),
		Effective: effective,
	}
}

func item(name string, limit int64, window time.Duration) string {
	s := name + ";q=" + strconv.FormatInt(limit, 10)
	if window > 0 {
		s += ";w=" + strconv.FormatInt(Seconds(window), 10)
	}
	return s
}

// names names each of several quotas after the policy quoted as name and
// its window, so that a client tells them apart and reads which is which:
// "default" with 10 per second and 1000 per hour gives "default/1s" and
// "default/1h". Windows can repeat only among a funnel's rates (the time
// each Burst takes to drain); a rate whose window an earlier one has gets
// its position too: "f/2s", "f/2s#2".
func names(name string, quotas []redlimit.Quota) []string {
	names := make([]string, len(quotas))
	seen := make(map[string]bool, len(quotas))
	for i, q := range quotas {
		l := span(q.Window)
		if seen[l] {
			l += "#" + strconv.Itoa(i+1)
		}
		seen[l] = true
		// What is added needs no escaping, so it goes inside the quotes
		// as it is: the result is the quoted name of policy+"/"+l.
		names[i] = name[:len(name)-1] + "/" + l + `"`
	}
	return names
}

// span writes a window in its largest whole unit: 1s, 90s, 1m, 1h, 1d, and
// 1500ms for a funnel's window that is not whole seconds.
func span(w time.Duration) string {
	for _, u := range [...]struct {
		d    time.Duration
		unit string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if w >= u.d && w%u.d == 0 {
			return strconv.FormatInt(int64(w/u.d), 10) + u.unit
		}
	}
	return strconv.FormatInt(w.Milliseconds(), 10) + "ms"
}

// Seconds rounds up to whole seconds, the only unit the fields allow.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
