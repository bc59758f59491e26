package mqttbench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// slowSubs are subscribers that never read (Options.SlowSubscribers):
// lean MQTT 3.1.1 connections with a small receive buffer, so that the
// broker's writes to them stall after a few KiB and its outbound queue
// for them fills. What the broker does then — buffer, drop, disconnect —
// is the point; disconnected counts the last.
type slowSubs struct{ conns []net.Conn }

// slowRecvBuffer is each slow subscriber's socket receive buffer.
const slowRecvBuffer = 4096

func dialSlow(ctx context.Context, o *Options, addr brokerAddr) (*slowSubs, error) {
	s := &slowSubs{}
	if o.SlowSubscribers == 0 {
		return s, nil
	}
	s.conns = make([]net.Conn, o.SlowSubscribers)
	err := parallel(ctx, o.SlowSubscribers, o.Workers, func(ctx context.Context, i int) error {
		c, err := dialSlowOne(ctx, o, addr, fmt.Sprintf("%sslow-%d", o.ClientPrefix, i))
		s.conns[i] = c
		return err
	})
	return s, err
}

func dialSlowOne(ctx context.Context, o *Options, addr brokerAddr, id string) (net.Conn, error) {
	dl := net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: -1}
	c, err := dl.DialContext(ctx, "tcp", addr.hostport)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(slowRecvBuffer)
	}
	d := leanDialer{keepAlive: 0, clean: true, timeout: o.ConnectTimeout}
	if _, err := d.handshake(ctx, c, id); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	if err := subscribeLean(c, o.filterOf(0), o.QoS, o.ConnectTimeout); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	return c, nil
}

// subscribeLean sends SUBSCRIBE (MQTT 3.1.1 §3.8: packet ID 1, one
// filter at qos) and reads the SUBACK (§3.9), refusing 0x80.
func subscribeLean(c net.Conn, filter string, qos byte, timeout time.Duration) error {
	b := []byte{0x82} // SUBSCRIBE, flags 0010 [MQTT-3.8.1-1]
	b = appendVarint(b, 2+2+len(filter)+1)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = binary.BigEndian.AppendUint16(b, uint16(len(filter)))
	b = append(b, filter...)
	b = append(b, qos)
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write(b); err != nil {
		return fmt.Errorf("write SUBSCRIBE: %w", err)
	}
	var ack [5]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return fmt.Errorf("read SUBACK: %w", err)
	}
	if ack[0] != 0x90 || ack[1] != 3 || ack[4] > 2 {
		return fmt.Errorf("%w: SUBACK % x", ErrSubackRefused, ack)
	}
	return c.SetDeadline(time.Time{})
}

// disconnected counts the slow subscribers the broker has closed (alive
// reads and discards what is queued in the socket, then sees the end).
func (s *slowSubs) disconnected() int {
	n := 0
	for _, c := range s.conns {
		if c != nil && !alive(c) {
			n++
		}
	}
	return n
}

func (s *slowSubs) close() {
	for _, c := range s.conns {
		if c != nil {
			_ = c.Close()
		}
	}
}
