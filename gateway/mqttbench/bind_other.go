//go:build !linux

package mqttbench

import "syscall"

// bindNoPort is Linux only; elsewhere a bound socket takes its port at bind.
var bindNoPort func(network, address string, c syscall.RawConn) error
