package mqttbench

import (
	"fmt"
	"syscall"
)

// ipBindAddressNoPort is IP_BIND_ADDRESS_NO_PORT of linux/in.h (Linux 4.2).
const ipBindAddressNoPort = 24

// bindNoPort lets a socket bound to a source address take its port only at
// connect, unique for the 4-tuple and with TIME_WAIT ports reusable
// (net.ipv4.tcp_tw_reuse): a bind alone reserves a port of the source
// address for every destination, and a run or two of 10,000 connections
// whose ports still sit in TIME_WAIT would exhaust the range.
func bindNoPort(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set IP_BIND_ADDRESS_NO_PORT: %w", serr)
	}
	return nil
}
