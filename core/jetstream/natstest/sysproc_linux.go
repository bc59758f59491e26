//go:build linux

package natstest

import "syscall"

// childSysProcAttr makes the kernel SIGKILL a child when the test binary
// dies, so no nats-server outlives it.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
