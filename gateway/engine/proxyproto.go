package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// The PROXY protocol (HAProxy, versions 1 and 2) lets a load balancer that
// terminates TLS tell the gateway who the client is: a header before the
// client's first byte. A listener with ProxyProtocol expects it on every
// connection and takes the client's address from it (LOCAL and UNKNOWN
// headers — health checks — keep the socket's peer).
//
//	v1: "PROXY TCP4 192.0.2.1 198.51.100.2 56324 1883\r\n" (at most 107 bytes)
//	v2: 12-byte signature, version/command, family/protocol, u16 length,
//	    addresses (IPv4: 4+4+2+2, IPv6: 16+16+2+2), then TLVs (ignored)

var proxyV2Sig = []byte("\r\n\r\n\x00\r\nQUIT\n")

// Bounds of a header: v1's by its spec; v2 allows TLVs, bounded here.
const (
	proxyV1Max = 107
	proxyV2Max = 16 + 2048
)

// errProxy marks a malformed or missing PROXY header.
var errProxy = errors.New("engine: bad PROXY protocol header")

// parseProxy reads a PROXY header at the start of b. n is its length (0:
// incomplete, read more); src is the client's address ("" for LOCAL or
// UNKNOWN: keep the socket's peer).
func parseProxy(b []byte) (n int, src string, err error) {
	if len(b) == 0 {
		return 0, "", nil
	}
	if b[0] == '\r' {
		return parseProxyV2(b)
	}
	if b[0] != 'P' {
		return 0, "", fmt.Errorf("%w: no header", errProxy)
	}
	return parseProxyV1(b)
}

func parseProxyV1(b []byte) (int, string, error) {
	const prefix = "PROXY "
	k := min(len(b), len(prefix))
	if !bytes.Equal(b[:k], []byte(prefix)[:k]) {
		return 0, "", fmt.Errorf("%w: v1 without the PROXY word", errProxy)
	}
	end := bytes.Index(b, []byte("\r\n"))
	if end < 0 {
		if len(b) >= proxyV1Max {
			return 0, "", fmt.Errorf("%w: v1 line longer than %d bytes", errProxy, proxyV1Max)
		}
		return 0, "", nil
	}
	if end+2 > proxyV1Max {
		return 0, "", fmt.Errorf("%w: v1 line longer than %d bytes", errProxy, proxyV1Max)
	}
	f := bytes.Split(b[len(prefix):end], []byte(" "))
	switch string(f[0]) {
	case "UNKNOWN":
		return end + 2, "", nil
	case "TCP4", "TCP6":
	default:
		return 0, "", fmt.Errorf("%w: v1 protocol %q", errProxy, f[0])
	}
	if len(f) != 5 {
		return 0, "", fmt.Errorf("%w: v1 with %d fields, want 5", errProxy, len(f))
	}
	ip := net.ParseIP(string(f[1]))
	if ip == nil || net.ParseIP(string(f[2])) == nil || (string(f[0]) == "TCP4") != (ip.To4() != nil) {
		return 0, "", fmt.Errorf("%w: v1 addresses %q %q", errProxy, f[1], f[2])
	}
	port, err := strconv.ParseUint(string(f[3]), 10, 16)
	if err != nil || (len(f[3]) > 1 && f[3][0] == '0') {
		return 0, "", fmt.Errorf("%w: v1 source port %q", errProxy, f[3])
	}
	if _, err := strconv.ParseUint(string(f[4]), 10, 16); err != nil {
		return 0, "", fmt.Errorf("%w: v1 destination port %q", errProxy, f[4])
	}
	return end + 2, net.JoinHostPort(ip.String(), strconv.Itoa(int(port))), nil
}

func parseProxyV2(b []byte) (int, string, error) {
	k := min(len(b), len(proxyV2Sig))
	if !bytes.Equal(b[:k], proxyV2Sig[:k]) {
		return 0, "", fmt.Errorf("%w: v2 signature", errProxy)
	}
	if len(b) < 16 {
		return 0, "", nil
	}
	verCmd, fam := b[12], b[13]
	if verCmd>>4 != 2 {
		return 0, "", fmt.Errorf("%w: v2 version %d", errProxy, verCmd>>4)
	}
	size := int(binary.BigEndian.Uint16(b[14:16]))
	if 16+size > proxyV2Max {
		return 0, "", fmt.Errorf("%w: v2 header of %d bytes", errProxy, 16+size)
	}
	if len(b) < 16+size {
		return 0, "", nil
	}
	n := 16 + size
	addr := b[16:n]
	switch verCmd & 0x0F {
	case 0x0: // LOCAL: the proxy's own connection (a health check)
		return n, "", nil
	case 0x1: // PROXY
	default:
		return 0, "", fmt.Errorf("%w: v2 command %d", errProxy, verCmd&0x0F)
	}
	switch fam {
	case 0x11, 0x12: // TCP or UDP over IPv4
		if len(addr) < 12 {
			return 0, "", fmt.Errorf("%w: v2 IPv4 addresses in %d bytes", errProxy, len(addr))
		}
		ip := net.IP(addr[0:4])
		port := binary.BigEndian.Uint16(addr[8:10])
		return n, net.JoinHostPort(ip.String(), strconv.Itoa(int(port))), nil
	case 0x21, 0x22: // IPv6
		if len(addr) < 36 {
			return 0, "", fmt.Errorf("%w: v2 IPv6 addresses in %d bytes", errProxy, len(addr))
		}
		ip := net.IP(addr[0:16])
		port := binary.BigEndian.Uint16(addr[32:34])
		return n, net.JoinHostPort(ip.String(), strconv.Itoa(int(port))), nil
	default: // UNSPEC, unix sockets: keep the peer
		return n, "", nil
	}
}
