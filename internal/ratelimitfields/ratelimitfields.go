// Package ratelimitfields formats one decision as the fields of
// draft-ietf-httpapi-ratelimit-headers, for httplimit (HTTP headers) and
// grpclimit (gRPC metadata), so that both write them by the same rules.
package ratelimitfields

import (
	"strconv"
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
	Policy string // RateLimit-Policy's item: name;q=Limit;w=Window
	Limit  string // RateLimit's item: name;r=Remaining;t=Seconds(Effective)
	// Effective is the effective window t: until the limiter is full again
	// (ResetAfter), or on a denial the wait (RetryAfter), as the draft wants.
	Effective time.Duration
}

// For returns r's fields. w is left out when the decision has no Window.
func For(name string, r redlimit.Result) Fields {
	effective := r.ResetAfter
	if !r.Allowed && r.RetryAfter >= 0 {
		effective = r.RetryAfter
	}
	policy := name + ";q=" + strconv.FormatInt(r.Limit, 10)
	if r.Window > 0 {
		policy += ";w=" + strconv.FormatInt(Seconds(r.Window), 10)
	}
	return Fields{
		Policy:    policy,
		Limit:     name + ";r=" + strconv.FormatInt(r.Remaining, 10) + ";t=" + strconv.FormatInt(Seconds(effective), 10),
		Effective: effective,
	}
}

// Seconds rounds up to whole seconds, the only unit the fields allow.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
