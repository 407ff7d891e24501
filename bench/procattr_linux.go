package main

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel kill the server should this program die
// without running its defers (SIGKILL, a crash): the benchmark must never
// leave a redis-server behind.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
