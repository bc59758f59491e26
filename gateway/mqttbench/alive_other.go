//go:build !(linux || darwin)

package mqttbench

import "net"

// alive cannot look at a socket without blocking here; it trusts conn.
func alive(net.Conn) bool { return true }
