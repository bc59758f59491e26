package engine_test

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// outPublish is a PUBLISH as an MQTT 5 client reads it: topic name,
// packet identifier (QoS 1 and 2), the Topic Alias property (0 if absent)
// and payload.
type outPublish struct {
	topic   string
	pid     uint16
	alias   uint16
	payload string
}

func readPublishV5(t *testing.T, c net.Conn) outPublish {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, p := parsePublishV5(t, c)
	return p
}

// parsePublishV5 reads one PUBLISH from r: its fixed header's first byte
// (flags: DUP, QoS, RETAIN) and what it carries.
func parsePublishV5(t *testing.T, r io.Reader) (byte, outPublish) {
	t.Helper()
	first, body := readFrame(t, r)
	require.Equal(t, byte(0x30), first&0xF0, "PUBLISH")
	n := int(binary.BigEndian.Uint16(body))
	p := outPublish{topic: string(body[2 : 2+n])}
	body = body[2+n:]
	if first&0x06 != 0 { // QoS 1 or 2
		p.pid = binary.BigEndian.Uint16(body)
		body = body[2:]
	}
	plen, used := int(body[0]), 1 // the tests' properties are short
	props := body[used : used+plen]
	for len(props) > 0 {
		switch props[0] {
		case 0x23:
			p.alias = binary.BigEndian.Uint16(props[1:3])
			props = props[3:]
		case 0x02: // message expiry
			props = props[5:]
		default:
			t.Fatalf("unexpected property 0x%02x", props[0])
		}
	}
	p.payload = string(body[used+plen:])
	return first, p
}

// TestServerTopicAliases: a client that allows topic aliases (Topic Alias
// Maximum in CONNECT) gets them: the first PUBLISH of a topic carries the
// alias and the name, later ones the alias alone [MQTT-3.3.2-12]; no more
// aliases than it allows [MQTT-3.3.2-10]; topics past that go by name; a
// client that allows none gets none [MQTT-3.3.2-9].
func TestServerTopicAliases(t *testing.T) {
	_, addr := start(t, engine.Options{})
	connect := func(id string, aliasMax byte) net.Conn {
		props := []byte{0}
		if aliasMax > 0 {
			props = []byte{3, 0x22, 0, aliasMax}
		}
		c := rawConnect(t, addr, packet(0x10, str("MQTT"), []byte{5, 0x02, 0, 60}, props, str(id)))
		_, err := c.Write(packet(0x82, []byte{0, 1, 0}, str("t/a"), []byte{0}, str("t/b"), []byte{0}))
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		first, _ := readFrame(t, c)
		require.Equal(t, byte(0x90), first, "SUBACK")
		return c
	}
	with := connect("aliases", 1)
	without := connect("no-aliases", 0)

	pub := dialV3(t, addr, "backend")
	for _, topic := range []string{"t/a", "t/a", "t/a", "t/b", "t/b"} {
		wait(t, pub.Publish(topic, 0, false, []byte(topic)))
	}
	want := []outPublish{
		{topic: "t/a", alias: 1, payload: "t/a"},
		{topic: "", alias: 1, payload: "t/a"},
		{topic: "", alias: 1, payload: "t/a"},
		{topic: "t/b", payload: "t/b"}, // the one alias is taken
		{topic: "t/b", payload: "t/b"},
	}
	for i, w := range want {
		require.Equal(t, w, readPublishV5(t, with), "publish %d to the client allowing 1 alias", i)
	}
	for i, w := range want {
		require.Equal(t, outPublish{topic: w.payload, payload: w.payload}, readPublishV5(t, without),
			"publish %d to the client allowing none", i)
	}
}
