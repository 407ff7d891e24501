//go:build !linux

package main

import "os/exec"

// setPdeathsig is Linux-only (Pdeathsig does not exist elsewhere): on other
// systems a killed benchmark can leave its redis-server running.
func setPdeathsig(*exec.Cmd) {}
