//go:build !linux

package natstest

import "syscall"

// childSysProcAttr has no parent-death signal outside Linux; children still
// exit when they notice they were re-parented (see MaybeChild).
func childSysProcAttr() *syscall.SysProcAttr { return nil }
