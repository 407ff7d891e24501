//go:build !linux

package redistest

import "os/exec"

// setPdeathsig is Linux-only; elsewhere a crashed test binary can leak servers.
func setPdeathsig(*exec.Cmd) {}
