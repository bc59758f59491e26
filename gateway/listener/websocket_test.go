package listener

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"
)

func TestWebsocketRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
	}{
		{name: "ws"},
		{name: "wss", tls: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := WSConfig{Config: Config{ID: tc.name, Address: "127.0.0.1:0"}}
			if tc.tls {
				cfg.TLS = serverTLS(t, false)
			}
			l := NewWebsocket(cfg)
			startBroker(t, l)
			require.Equal(t, tc.name, l.Protocol())

			c, err := connectPaho(t, tc.name+"://"+l.Address()+"/mqtt", "rt-"+tc.name, clientTLS(t, ""))
			require.NoError(t, err)
			roundTrip(t, c)

			st := l.Stats()
			require.Equal(t, uint64(1), st.Accepted)
			require.Equal(t, 1, st.Active)
		})
	}
}

func TestWebsocketHTTP(t *testing.T) {
	l := NewWebsocket(WSConfig{Config: Config{ID: "ws", Address: "127.0.0.1:0"}})
	startBroker(t, l)
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: waitFor}

	for path, want := range map[string]int{
		"/":        http.StatusNotFound,
		"/other":   http.StatusNotFound,
		"/mqtt/x":  http.StatusNotFound,
		"/mqtt":    http.StatusBadRequest, // not a websocket handshake
		"/mqtt?a=": http.StatusBadRequest,
	} {
		resp, err := hc.Get("http://" + l.Address() + path)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, path)
	}
	require.Eventually(t, func() bool { return l.Stats().Active == 0 }, waitFor, 5*time.Millisecond)
}

// The server selects "mqtt" whenever the client offers it [MQTT-6.0.0-4]
// ("mqttv3.1" only for a client that offers just that).
func TestWebsocketSubprotocol(t *testing.T) {
	l := NewWebsocket(WSConfig{Config: Config{ID: "ws", Address: "127.0.0.1:0"}})
	startBroker(t, l)

	for _, offer := range [][]string{{"mqtt"}, {"mqttv3.1"}, {"other", "mqtt"}} {
		ws := dialWS(t, l, websocket.Dialer{Subprotocols: offer})
		require.Equal(t, offer[len(offer)-1], ws.Subprotocol())
	}
}

// MQTT packets need not line up with websocket frames or messages
// [MQTT-6.0.0-2].
func TestWebsocketFraming(t *testing.T) {
	l := NewWebsocket(WSConfig{Config: Config{ID: "ws", Address: "127.0.0.1:0"}})
	startBroker(t, l)

	t.Run("packet split over messages", func(t *testing.T) {
		ws := dialWS(t, l, websocket.Dialer{Subprotocols: []string{"mqtt"}})
		for _, b := range connectPacket("split-messages") {
			require.NoError(t, ws.WriteMessage(websocket.BinaryMessage, []byte{b}))
		}
		requireConnack(t, newPacketReader(t, ws))
	})

	t.Run("packet split over frames", func(t *testing.T) {
		// A one-byte write buffer makes every byte a frame of its own, all
		// in one message.
		ws := dialWS(t, l, websocket.Dialer{Subprotocols: []string{"mqtt"}, WriteBufferSize: 1})
		w, err := ws.NextWriter(websocket.BinaryMessage)
		require.NoError(t, err)
		_, err = w.Write(connectPacket("split-frames"))
		require.NoError(t, err)
		require.NoError(t, w.Close())
		requireConnack(t, newPacketReader(t, ws))
	})

	t.Run("packets in one frame", func(t *testing.T) {
		ws := dialWS(t, l, websocket.Dialer{Subprotocols: []string{"mqtt"}})
		var msg []byte
		msg = append(msg, connectPacket("one-frame")...)
		msg = append(msg, subscribePacket(1, "framing/t")...)
		msg = append(msg, publishPacket("framing/t", "hi")...)
		msg = append(msg, 0xc0, 0x00) // PINGREQ
		require.NoError(t, ws.WriteMessage(websocket.BinaryMessage, msg))

		r := newPacketReader(t, ws)
		requireConnack(t, r)
		// The PUBLISH comes back through mochi's write queue, so its order
		// against SUBACK and PINGRESP is not fixed.
		got := map[byte][]byte{}
		for range 3 {
			typ, body := r.next()
			got[typ] = body
		}
		require.Equal(t, map[byte][]byte{
			0x90: {0x00, 0x01, 0x00}, // SUBACK, packet ID 1, QoS 0 granted
			0x30: append([]byte{0x00, 0x09}, "framing/thi"...),
			0xd0: {}, // PINGRESP
		}, got)
	})
}

// A text message [MQTT-6.0.0-1], or a message over MaxMessageSize, closes
// the connection.
func TestWebsocketRejectsBadMessages(t *testing.T) {
	l := NewWebsocket(WSConfig{
		Config:         Config{ID: "ws", Address: "127.0.0.1:0"},
		MaxMessageSize: 64,
	})
	startBroker(t, l)

	t.Run("text message", func(t *testing.T) {
		ws := dialWS(t, l, websocket.Dialer{Subprotocols: []string{"mqtt"}})
		require.NoError(t, ws.WriteMessage(websocket.BinaryMessage, connectPacket("text")))
		requireConnack(t, newPacketReader(t, ws))
		require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte{0xc0, 0x00}))
		requireWSClosed(t, ws)
	})

	t.Run("message too large", func(t *testing.T) {
		ws := dialWS(t, l, websocket.Dialer{Subprotocols: []string{"mqtt"}})
		require.NoError(t, ws.WriteMessage(websocket.BinaryMessage, connectPacket("large")))
		requireConnack(t, newPacketReader(t, ws))
		require.NoError(t, ws.WriteMessage(websocket.BinaryMessage, publishPacket("t", string(make([]byte, 100)))))
		requireWSClosed(t, ws)
	})
}

// Connections that never send the upgrade request, never finish the TLS
// handshake, or never send CONNECT must not hold up the server's Close.
func TestWebsocketCloseWithIdleConnections(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
	}{
		{name: "ws"},
		{name: "wss", tls: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := WSConfig{Config: Config{ID: tc.name, Address: "127.0.0.1:0"}}
			dialer := websocket.Dialer{Subprotocols: []string{"mqtt"}}
			if tc.tls {
				cfg.TLS = serverTLS(t, false)
				dialer.TLSClientConfig = clientTLS(t, "")
			}
			l := NewWebsocket(cfg)
			b := startBroker(t, l)
			client, err := connectPaho(t, tc.name+"://"+l.Address()+"/mqtt", "idle-"+tc.name, clientTLS(t, ""))
			require.NoError(t, err)
			silent := dialSilent(t, l.Address())
			noConnect := dialWS(t, l, dialer)
			require.Eventually(t, func() bool { return l.Stats().Active == 3 }, waitFor, 5*time.Millisecond)

			requireReturnsWithin(t, 2*time.Second, b.close)
			require.Equal(t, 0, l.Stats().Active)
			requireClosedByPeer(t, silent)
			requireWSClosed(t, noConnect)
			require.Eventually(t, func() bool { return !client.IsConnectionOpen() }, waitFor, 5*time.Millisecond)
		})
	}
}

func TestWebsocketHandshakeTimeout(t *testing.T) {
	l := NewWebsocket(WSConfig{Config: Config{
		ID:               "wss",
		Address:          "127.0.0.1:0",
		TLS:              serverTLS(t, false),
		HandshakeTimeout: 200 * time.Millisecond,
	}})
	startBroker(t, l)

	c := dialSilent(t, l.Address())
	requireClosedByPeer(t, c)
	require.Eventually(t, func() bool {
		st := l.Stats()
		return st.HandshakeFailures == 1 && st.Active == 0
	}, waitFor, 5*time.Millisecond)
}

func TestWebsocketCloseIdempotent(t *testing.T) {
	l := NewWebsocket(WSConfig{Config: Config{ID: "ws", Address: "127.0.0.1:0"}})
	require.NoError(t, l.Init(nil))
	served := make(chan struct{})
	go func() {
		defer close(served)
		l.Serve(drain)
	}()
	ws := dialWS(t, l, websocket.Dialer{})
	require.Eventually(t, func() bool { return l.Stats().Active == 1 }, waitFor, 5*time.Millisecond)

	calls := 0
	l.Close(func(string) { calls++ })
	<-served
	l.Close(func(string) { calls++ })
	require.Equal(t, 1, calls)
	requireWSClosed(t, ws)
	require.ErrorIs(t, l.Init(nil), ErrClosed)
	l.Serve(drain)

	never := NewWebsocket(WSConfig{Config: Config{ID: "ws"}})
	never.Close(nil)
	never.Close(nil)
	never.Serve(drain)
}

func TestWebsocketInit(t *testing.T) {
	l := NewWebsocket(WSConfig{Config: Config{ID: "ws"}, Path: "mqtt", MaxMessageSize: -1})
	err := l.Init(nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, `Path "mqtt"`)
	require.ErrorContains(t, err, "negative MaxMessageSize")
}

func dialWS(t testing.TB, l *Websocket, d websocket.Dialer) *websocket.Conn {
	t.Helper()
	scheme := "ws"
	if l.cfg.TLS != nil {
		scheme = "wss"
		if d.TLSClientConfig == nil {
			d.TLSClientConfig = clientTLS(t, "")
		}
	}
	d.HandshakeTimeout = waitFor
	ws, resp, err := d.Dial(scheme+"://"+l.Address()+l.cfg.Path, nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	t.Cleanup(func() { _ = ws.Close() })
	return ws
}

// requireWSClosed reads from ws until the server ends the connection,
// failing if that takes longer than waitFor.
func requireWSClosed(t testing.TB, ws *websocket.Conn) {
	t.Helper()
	requireClosedByPeer(t, ws.NetConn())
}

// packetReader reads MQTT packets, with remaining lengths under 128, from
// the binary messages of a websocket connection.
type packetReader struct {
	t   testing.TB
	ws  *websocket.Conn
	buf []byte
}

func newPacketReader(t testing.TB, ws *websocket.Conn) *packetReader {
	return &packetReader{t: t, ws: ws}
}

// next returns the next packet's type (the first byte) and its body.
func (r *packetReader) next() (byte, []byte) {
	r.t.Helper()
	require.NoError(r.t, r.ws.SetReadDeadline(time.Now().Add(waitFor)))
	for len(r.buf) < 2 || len(r.buf) < 2+int(r.buf[1]) {
		typ, msg, err := r.ws.ReadMessage()
		require.NoError(r.t, err)
		require.Equal(r.t, websocket.BinaryMessage, typ)
		r.buf = append(r.buf, msg...)
	}
	require.Less(r.t, r.buf[1], byte(0x80), "remaining length over 127")
	typ, n := r.buf[0], int(r.buf[1])
	body := append([]byte{}, r.buf[2:2+n]...)
	r.buf = r.buf[2+n:]
	return typ, body
}

func requireConnack(t testing.TB, r *packetReader) {
	t.Helper()
	typ, body := r.next()
	require.Equal(t, byte(0x20), typ, "CONNACK")
	require.Equal(t, []byte{0x00, 0x00}, body, "session not present, accepted")
}

// connectPacket encodes an MQTT 3.1.1 CONNECT with a clean session, a 60 s
// keep-alive and no credentials.
func connectPacket(clientID string) []byte {
	body := []byte{0x00, 0x04, 'M', 'Q', 'T', 'T', 0x04, 0x02, 0x00, 0x3c}
	body = appendString(body, clientID)
	return packet(0x10, body)
}

// subscribePacket encodes a SUBSCRIBE to one topic at QoS 0.
func subscribePacket(id uint16, topic string) []byte {
	body := appendString([]byte{byte(id >> 8), byte(id)}, topic)
	return packet(0x82, append(body, 0x00))
}

// publishPacket encodes a QoS 0 PUBLISH.
func publishPacket(topic, payload string) []byte {
	return packet(0x30, append(appendString(nil, topic), payload...))
}

func appendString(b []byte, s string) []byte {
	b = append(b, byte(len(s)>>8), byte(len(s)))
	return append(b, s...)
}

// packet prefixes body with a fixed header; the remaining length is encoded
// as MQTT's variable byte integer.
func packet(header byte, body []byte) []byte {
	b := []byte{header}
	n := len(body)
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			break
		}
	}
	return append(b, body...)
}

// The websocket net.Conn maps deadlines and addresses onto the websocket.
func TestWSConnDeadlinesAndAddrs(t *testing.T) {
	type result struct {
		remote                 string
		setErr, readErr, wrErr error
		readAfterExpiry        error
	}
	results := make(chan result, 1)
	l := NewWebsocket(WSConfig{Config: Config{ID: "ws", Address: "127.0.0.1:0"}})
	require.NoError(t, l.Init(nil))
	served := make(chan struct{})
	go func() {
		defer close(served)
		l.Serve(func(_ string, c net.Conn) error {
			var r result
			r.remote = c.RemoteAddr().String()
			r.setErr = c.SetDeadline(time.Now().Add(-time.Second))
			_, r.readErr = c.Read(make([]byte, 8))
			_, r.wrErr = c.Write([]byte("x"))
			_, r.readAfterExpiry = c.Read(make([]byte, 8)) // sticky, no gorilla panic
			results <- r
			return nil
		})
	}()
	t.Cleanup(func() {
		l.Close(nil)
		<-served
	})

	ws := dialWS(t, l, websocket.Dialer{})
	r := <-results
	require.NoError(t, r.setErr)
	require.Equal(t, ws.LocalAddr().String(), r.remote)
	var ne net.Error
	require.ErrorAs(t, r.readErr, &ne)
	require.True(t, ne.Timeout(), "read: %v", r.readErr)
	require.ErrorAs(t, r.wrErr, &ne)
	require.True(t, ne.Timeout(), "write: %v", r.wrErr)
	require.Equal(t, r.readErr, r.readAfterExpiry)
}
