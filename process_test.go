package redlimit

// Child processes. The tests that need several OS processes (exactness
// under concurrency, leases and in-flight holds across processes, faults
// under load, a holder killed with SIGKILL) run this test binary again as
// TestChild, which plays the role its parent names on the spec it is given
// and prints its report as JSON. startChild is the one way a test starts
// one; runChildren starts several, waits for them and reads their reports.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	// childRoleEnv names the role a child plays (a key of childRoles);
	// without it TestChild skips.
	childRoleEnv = "REDLIMIT_CHILD_ROLE"
	// childSpecEnv carries the role's spec, as JSON.
	childSpecEnv = "REDLIMIT_CHILD_SPEC"
	// childTimeout bounds a child that its parent failed to end: a parent's
	// own context ends its children much sooner.
	childTimeout = 2 * time.Minute
)

// childRoles are the roles a child plays: each reads its spec (JSON) and
// returns its report, which TestChild prints as JSON.
var childRoles = map[string]func(t *testing.T, spec []byte) any{
	"concurrency": concurrencyChild, // TestExactnessUnderConcurrency, TestMultiRateExactUnderConcurrency
	"faults":      faultChild,       // TestReplyLostAcrossProcesses, TestRestartOverAdmission
	"inflight":    inflightChild,    // TestInFlightAcrossProcesses
	"lease":       leaseChild,       // TestLeaseAcrossProcesses, TestLeaseHolderKilled
}

// TestChild is every child process: it plays the role its parent named.
func TestChild(t *testing.T) {
	role := os.Getenv(childRoleEnv)
	if role == "" {
		t.Skip("runs only as a child process (startChild)")
	}
	play, ok := childRoles[role]
	require.True(t, ok, "no child role %q", role)
	report := play(t, []byte(os.Getenv(childSpecEnv)))
	require.NoError(t, json.NewEncoder(os.Stdout).Encode(report))
}

// decodeSpec reads a child's spec into v.
func decodeSpec(t *testing.T, raw []byte, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(raw, v), "the child's spec")
}

// child is a running child process.
type child struct {
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	stdout, stderr *childOutput
	waited         sync.Once
	err            error
}

// startChild starts a child playing role on spec. ctx's end kills it, and so
// does the end of the test.
func startChild(ctx context.Context, t *testing.T, role string, spec any) *child {
	t.Helper()
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChild$", "-test.count=1", "-test.timeout="+childTimeout.String())
	cmd.Env = append(os.Environ(), childRoleEnv+"="+role, childSpecEnv+"="+string(raw))
	c := &child{cmd: cmd, stdout: &childOutput{}, stderr: &childOutput{}}
	cmd.Stdout, cmd.Stderr = c.stdout, c.stderr
	c.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = c.wait()
	})
	return c
}

// wait waits for the child to end, and says why if it failed.
func (c *child) wait() error {
	c.waited.Do(func() {
		if err := c.cmd.Wait(); err != nil {
			c.err = fmt.Errorf("%w\nstdout tail: %s\nstderr tail: %s", err, tail(c.stdout.String(), 2000), tail(c.stderr.String(), 2000))
		}
	})
	return c.err
}

// report waits for the child to end and reads its report into v.
func (c *child) report(v any) error {
	if err := c.wait(); err != nil {
		return err
	}
	// Past the report, the test binary prints its verdict (PASS).
	out, _, _ := strings.Cut(c.stdout.String(), "PASS\n")
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("its report: %w: %s", err, tail(out, 2000))
	}
	return nil
}

// kill ends the child with SIGKILL and waits for it to be gone.
func (c *child) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Kill())
	_ = c.wait()
}

// runChildren runs a child playing role on each of specs; calls during (if
// not nil) while they run, then closes their stdin; and returns each one's
// report, once all have ended.
func runChildren[R any](ctx context.Context, t *testing.T, role string, specs []any, during func()) []R {
	t.Helper()
	children := make([]*child, len(specs))
	for i, spec := range specs {
		children[i] = startChild(ctx, t, role, spec)
	}
	if during != nil {
		during()
	}
	for _, c := range children {
		c.stdin.Close()
	}
	reports := make([]R, len(children))
	var errs []error
	for i, c := range children {
		if err := c.report(&reports[i]); err != nil {
			errs = append(errs, fmt.Errorf("child %d: %w", i, err))
		}
	}
	require.NoError(t, errors.Join(errs...))
	return reports
}

// childOutput collects a child's output, which a test may read while the
// child still writes.
type childOutput struct {
	mu  sync.Mutex
	out strings.Builder
}

func (o *childOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.out.Write(p)
}

func (o *childOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.out.String()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
