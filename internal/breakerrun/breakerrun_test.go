package breakerrun

import (
	"errors"
	"testing"

	"github.com/redlimit/redlimit"
)

func TestRun(t *testing.T) {
	var r Run
	other := errors.New("down")
	var told []bool
	for _, step := range []error{other, redlimit.ErrBreakerOpen, redlimit.ErrBreakerOpen, nil, redlimit.ErrBreakerOpen, redlimit.ErrBreakerOpen, other, redlimit.ErrBreakerOpen} {
		if step == nil {
			r.Decided()
			continue
		}
		told = append(told, r.Tell(step))
	}
	want := []bool{true, true, false, true, false, true, true}
	for i := range want {
		if told[i] != want[i] {
			t.Fatalf("told %v, want %v", told, want)
		}
	}
}
