package gateway_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// Bad input the gateway itself checks, before or around mochi, each over a
// real loopback connection with hand-made bytes: the connection is closed
// (MQTT 3.1.1 §4.8 [MQTT-4.8.0-1], MQTT 5 §4.13 [MQTT-4.13.1-1]), an MQTT 5
// client past its CONNACK is told why with a DISCONNECT first, and other
// clients carry on. docs/gateway.md has the table of rules and tests; the
// rules checked by existing tests (first packet not CONNECT, CONNECT too
// large, the connect timeout, the MQTT 3 framing cases, a mochi panic) are
// tagged where they are.

// readFrame reads one MQTT packet of any size: its first byte and body.
func readFrame(t testing.TB, r io.Reader) (first byte, body []byte) {
	t.Helper()
	var b [1]byte
	_, err := io.ReadFull(r, b[:])
	require.NoError(t, err, "read fixed header")
	first = b[0]
	n, shift := 0, 0
	for i := 0; ; i++ {
		require.Less(t, i, 4, "remaining length over 4 bytes")
		_, err = io.ReadFull(r, b[:])
		require.NoError(t, err, "read remaining length")
		n |= int(b[0]&0x7F) << shift
		shift += 7
		if b[0]&0x80 == 0 {
			break
		}
	}
	body = make([]byte, n)
	_, err = io.ReadFull(r, body)
	require.NoError(t, err, "read body")
	return first, body
}

// requireDisconnect reads the next packet, which must be an MQTT 5
// DISCONNECT with reason code code, then waits for the close.
func requireDisconnect(t testing.TB, c net.Conn, code byte) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	first, body := readFrame(t, c)
	require.Equal(t, byte(0xE0), first, "DISCONNECT, got type %#x body %x", first, body)
	require.NotEmpty(t, body, "DISCONNECT without a reason code")
	require.Equal(t, code, body[0], "DISCONNECT reason code")
	requireClosed(t, c, 10*time.Second)
}

// requireClosedSilently waits for the close and fails if any byte came
// first: MQTT 3 has no server DISCONNECT, and before a CONNACK none may be
// sent [MQTT-3.14.0-1].
func requireClosedSilently(t testing.TB, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	got, err := io.ReadAll(c)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server did not close the connection")
	require.Empty(t, got, "bytes before the close")
}

// bystanders connects an MQTT 3.1.1 and an MQTT 5 client that must not
// notice anything; call the returned check at the end.
func bystanders(t *testing.T, addr string) (check func()) {
	t.Helper()
	v3 := dialV3(t, addr, "bystander-v3")
	v5 := dialV5(t, addr, "bystander-v5", nil)
	return func() {
		t.Helper()
		require.True(t, v3.IsConnectionOpen(), "the MQTT 3 bystander stays connected")
		tok := v3.Publish("health/bystander-v3", 1, false, "still here")
		require.True(t, tok.WaitTimeout(5*time.Second))
		require.NoError(t, tok.Error())
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		res, err := v5.Publish(ctx, &paho.Publish{Topic: "health/bystander-v5", QoS: 1, Payload: []byte("still here")})
		require.NoError(t, err, "the MQTT 5 bystander stays connected")
		require.Equal(t, byte(0), res.ReasonCode)
	}
}

// The framing rules conn.go checks, after a CONNECT was accepted: MQTT 5
// clients get DISCONNECT with a reason code first, MQTT 3 clients see the
// close. (Before CONNACK every case closes silently: TestBadInput…,
// TestHugeTrickledConnectRefused.)
func TestSpecFramingRefused(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Gateway: gateway.Options{MaxPacketBytes: 1024}})
	check := bystanders(t, env.TCP)

	publishHeader := append([]byte{0x30}, remLen(4096)...) // declares 4 KiB; the body never comes
	cases := []struct {
		name    string
		connect []byte
		send    []byte
		code    byte // the DISCONNECT reason code expected; 0: closed without a packet
	}{
		// [MQTT-3.2.2-15] The client must not send a packet over the Maximum Packet
		// Size the CONNACK announced; the gateway refuses it from the fixed header,
		// with DISCONNECT 0x95 (MQTT 5 §3.2.2.3.6).
		{"MQTT-3.2.2-15 v5 packet over max_packet_bytes", connectV5("big5"), publishHeader, 0x95},
		// MQTT 3.1.1 has no packet size limit to announce: the gateway's bound
		// closes the connection [MQTT-4.8.0-1].
		{"MQTT-4.8.0-1 v3 packet over max_packet_bytes", connectV4("big3"), publishHeader, 0},
		// [MQTT-4.13.1-1] A remaining length runs four bytes at most (MQTT 5 §1.5.5,
		// §2.1.4): a fifth is a Malformed Packet, 0x81.
		{"MQTT-4.13.1-1 v5 remaining length of 5 bytes", connectV5("len5"), []byte{0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F}, 0x81},
		// [MQTT-4.13.1-1] Packet type 0 is reserved (MQTT 5 §2.1.2): Malformed Packet.
		{"MQTT-4.13.1-1 v5 reserved packet type 0", connectV5("type0"), []byte{0x00, 0x00}, 0x81},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := rawConn(t, env.TCP, tc.connect)
			_, err := c.Write(tc.send)
			require.NoError(t, err)
			if tc.code != 0 {
				requireDisconnect(t, c, tc.code)
			} else {
				requireClosedSilently(t, c)
			}
			healthy(t, env)
		})
	}
	check()
}

// [MQTT-3.2.2-17] The gateway announces Topic Alias Maximum 64 (the bound of
// each client's alias table); an alias above it is refused with DISCONNECT
// 0x94 Topic Alias invalid (mochi checks it against the gateway's value).
func TestSpecTopicAliasOverMaximum(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	check := bystanders(t, env.TCP)
	c := rawConn(t, env.TCP, connectV5("alias"))
	props := []byte{3, 0x23, 0, 65} // property length 3: Topic Alias (0x23) = 65
	_, err := c.Write(packet(0x30, str("telemetry/alias"), props, []byte("x")))
	require.NoError(t, err)
	requireDisconnect(t, c, 0x94)
	check()
}

// [MQTT-3.8.3-1] An MQTT 5 SUBSCRIBE whose filter has no options byte is
// a Malformed Packet (mochi v2.7.9's decoder panicked on it): the engine
// closes that connection with DISCONNECT 0x81 [MQTT-4.13.1-1] and, since
// the client sent no DISCONNECT, publishes its will [MQTT-3.1.2-8] and
// reports the disconnect as malformed_packet.
func TestSpecSubscribeWithoutOptionsClosesWithWill(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	check := bystanders(t, env.TCP)
	// CONNECT: clean start, will flag, will QoS 0; payload: client ID, no
	// will properties, will topic, will payload.
	connect := packet(0x10, str("MQTT"), []byte{5, 0x06, 0, 60, 0}, str("car-p"), []byte{0}, str("status/car-p"), str("gone"))
	c := rawConn(t, env.TCP, connect)
	_, err := c.Write(packet(0x82, []byte{0, 1, 0}, str("a")))
	require.NoError(t, err)
	requireDisconnect(t, c, 0x81)
	require.Eventually(t, func() bool {
		return len(byKey(readAll(t, env.Store, "status"))["car-p"]) == 1
	}, 10*time.Second, 10*time.Millisecond, "the will reaches the core")
	require.Equal(t, []string{"gone"}, byKey(readAll(t, env.Store, "status"))["car-p"])
	require.Eventually(t, func() bool {
		es := eventNames(events(t, env, "car-p"))
		return len(es) > 0 && es[len(es)-1] == "disconnected:malformed_packet"
	}, 10*time.Second, 10*time.Millisecond)
	check()
}

// wsStream is an MQTT-over-websocket client connection as a byte stream:
// binary messages in, each Write one binary message out.
type wsStream struct {
	*websocket.Conn
	r io.Reader
}

func dialWS(t testing.TB, addr string, tc *tls.Config) *wsStream {
	t.Helper()
	scheme := "ws://"
	if tc != nil {
		scheme = "wss://"
	}
	d := websocket.Dialer{Subprotocols: []string{"mqtt"}, HandshakeTimeout: 5 * time.Second, TLSClientConfig: tc}
	ws, resp, err := d.Dial(scheme+addr+"/mqtt", nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	t.Cleanup(func() { _ = ws.Close() })
	return &wsStream{Conn: ws}
}

func (s *wsStream) Read(p []byte) (int, error) {
	for {
		if s.r == nil {
			typ, r, err := s.NextReader()
			if err != nil {
				return 0, err
			}
			if typ != websocket.BinaryMessage {
				return 0, errors.New("not a binary message")
			}
			s.r = r
		}
		n, err := s.r.Read(p)
		if errors.Is(err, io.EOF) {
			s.r, err = nil, nil
		}
		if n > 0 || err != nil {
			return n, err
		}
	}
}

func (s *wsStream) Write(p []byte) (int, error) {
	if err := s.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *wsStream) SetDeadline(t time.Time) error {
	return errors.Join(s.SetReadDeadline(t), s.SetWriteDeadline(t))
}

// mqttConnect sends CONNECT on c and expects a successful CONNACK.
func mqttConnect(t testing.TB, c net.Conn, connect []byte) {
	t.Helper()
	_, err := c.Write(connect)
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	first, body := readFrame(t, c)
	require.Equal(t, byte(0x20), first, "CONNACK")
	require.GreaterOrEqual(t, len(body), 2)
	require.Equal(t, byte(0), body[1], "CONNACK code")
}

// MQTT over websockets travels in binary messages only [MQTT-6.0.0-1]; a
// text message, or a message over max_packet_bytes + 1 KiB (the
// websocket read limit), closes the connection.
func TestSpecWebsocketFraming(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Gateway: gateway.Options{MaxPacketBytes: 1024}})
	check := bystanders(t, env.TCP)
	wsBystander := dialWS(t, env.WS, nil)
	mqttConnect(t, wsBystander, connectV4("ws-bystander"))

	cases := []struct {
		name string
		typ  int
		msg  []byte
	}{
		{"MQTT-6.0.0-1 text message", websocket.TextMessage, []byte{0xC0, 0x00}}, // a PINGREQ, as text
		{"message over the read limit", websocket.BinaryMessage, []byte(strings.Repeat("\xC0\x00", 2048))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialWS(t, env.WS, nil)
			mqttConnect(t, c, connectV5("ws-bad"))
			require.NoError(t, c.WriteMessage(tc.typ, tc.msg))
			require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
			_, msg, err := c.ReadMessage()
			require.Error(t, err, "the connection must close; got message %x", msg)
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server did not close the connection")
			healthy(t, env)
		})
	}
	_, err := wsBystander.Write([]byte{0xC0, 0x00}) // PINGREQ
	require.NoError(t, err)
	require.NoError(t, wsBystander.SetReadDeadline(time.Now().Add(5*time.Second)))
	first, _ := readFrame(t, wsBystander)
	require.Equal(t, byte(0xD0), first, "PINGRESP to the websocket bystander")
	check()
}

// Lingering close (conn.Close): a client that sends more QoS 2 publishes
// than the Receive Maximum gets DISCONNECT 0x93 [MQTT-3.3.4-7], and it can
// read it even though it keeps writing after the server sent it, on every
// transport. Without the lingering close the gateway closed the socket at
// once, the kernel answered the client's next bytes with a TCP reset and
// the client's writes failed before it read the DISCONNECT (Paho
// interoperability client_test5.py test_flow_control2, docs/conformance.md).
// The connection is still closed afterwards [MQTT-4.13.2-1].
func TestLingeringCloseDeliversDisconnect(t *testing.T) {
	srvTLS, err := gateway.LoadTLS("../testdata/tls/server.pem", "../testdata/tls/server-key.pem", "")
	require.NoError(t, err)
	env := gatewaytest.Start(t, gatewaytest.Options{Gateway: gateway.Options{
		ReceiveMaximum: 2,
		Listeners: []gateway.Listener{
			{Type: "tcp", Addr: "127.0.0.1:0"},
			{Type: "ws", Addr: "127.0.0.1:0"},
			{Type: "tcp", Addr: "127.0.0.1:0", TLS: srvTLS},
			{Type: "ws", Addr: "127.0.0.1:0", TLS: srvTLS},
		},
	}})
	check := bystanders(t, env.TCP)
	pool := x509.NewCertPool()
	ca, err := os.ReadFile("../testdata/tls/ca.pem")
	require.NoError(t, err)
	require.True(t, pool.AppendCertsFromPEM(ca))
	clientTLS := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}

	transports := []struct {
		name string
		dial func(t *testing.T) net.Conn
	}{
		{"tcp", func(t *testing.T) net.Conn { return rawConn(t, env.TCP, nil) }},
		{"ws", func(t *testing.T) net.Conn { return dialWS(t, env.WS, nil) }},
		{"tls", func(t *testing.T) net.Conn {
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", env.Gateway.Addr("tls").String(), clientTLS)
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			return c
		}},
		{"wss", func(t *testing.T) net.Conn { return dialWS(t, env.Gateway.Addr("wss").String(), clientTLS) }},
	}
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			id := "linger-" + tr.name
			c := tr.dial(t)
			mqttConnect(t, c, connectV5(id))
			publish := func(pid uint16) {
				t.Helper()
				_, err := c.Write(packet(0x34, str("telemetry/"+id), []byte{byte(pid >> 8), byte(pid), 0}, []byte("x")))
				require.NoError(t, err)
			}
			// Two QoS 2 publishes left at PUBREC take the whole Receive Maximum …
			publish(1)
			publish(2)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
			for pid := uint16(1); pid <= 2; pid++ {
				first, body := readFrame(t, c)
				require.Equal(t, byte(0x50), first, "PUBREC")
				require.Equal(t, []byte{0, byte(pid)}, body[:2])
			}
			// … so a third is one too many.
			publish(3)
			require.Eventually(t, func() bool {
				return !env.Gateway.Engine().HasSession(id)
			}, 10*time.Second, 5*time.Millisecond, "the gateway ends the connection")

			// The server has sent DISCONNECT and is done with the connection;
			// the client, not having read it yet, goes on writing (PUBRELs
			// for the PUBRECs, as a client that answers them would).
			for i := range 20 {
				_, err := c.Write([]byte{0x62, 2, 0, byte(1 + i%2)})
				require.NoError(t, err, "write %d after the server's DISCONNECT", i)
			}
			requireDisconnect(t, c, 0x93)
		})
	}
	check()
}

// MQTT 3.1.1 has no server-to-client DISCONNECT (§3.14): a client whose
// session is taken over by a new connection with its client ID sees its
// connection close and no DISCONNECT bytes (mochi would send E0 00), while
// an MQTT 5 client is told 0x8E (Session taken over).
func TestSpecTakeoverSendsNoV3Disconnect(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	old := rawConn(t, env.TCP, nil)
	_, err := old.Write(packet(0x10, str("MQTT"), []byte{4, 0x02, 0, 60}, str("twin")))
	require.NoError(t, err)
	require.NoError(t, old.SetReadDeadline(time.Now().Add(5*time.Second)))
	require.Equal(t, []byte{0x20, 2, 0, 0}, readPacket(t, old))
	require.NoError(t, old.SetReadDeadline(time.Time{}))
	check := bystanders(t, env.TCP)

	newer := rawConn(t, env.TCP, nil)
	_, err = newer.Write(packet(0x10, str("MQTT"), []byte{4, 0x02, 0, 60}, str("twin")))
	require.NoError(t, err)
	require.NoError(t, newer.SetReadDeadline(time.Now().Add(5*time.Second)))
	require.Equal(t, []byte{0x20, 2, 0, 0}, readPacket(t, newer))
	requireClosedSilently(t, old)

	old5 := rawConn(t, env.TCP, nil)
	_, err = old5.Write(packet(0x10, str("MQTT"), []byte{5, 0x02, 0, 60, 0}, str("twin5")))
	require.NoError(t, err)
	require.NoError(t, old5.SetReadDeadline(time.Now().Add(5*time.Second)))
	first, _ := readFrame(t, old5)
	require.Equal(t, byte(0x20), first)
	newer5 := rawConn(t, env.TCP, nil)
	_, err = newer5.Write(packet(0x10, str("MQTT"), []byte{5, 0x02, 0, 60, 0}, str("twin5")))
	require.NoError(t, err)
	requireDisconnect(t, old5, 0x8E)
	check()
}
