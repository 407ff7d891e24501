package redistest

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel kill the child if the test binary dies
// without running its cleanups (crash, SIGKILL, timeout panic).
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
