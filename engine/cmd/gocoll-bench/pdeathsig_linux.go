package main

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes a rank die with its launcher, so that killing
// gocoll-bench -procs never leaves ranks behind.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
