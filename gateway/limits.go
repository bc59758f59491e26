package gateway

import (
	"bytes"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// limits is the gateway's own hook: it links each mochi client to its
// conn (for panic cleanup), caps keepalive, and counts sessions.
type limits struct {
	mqtt.HookBase
	g        *Gateway
	allowAll bool // no auth hook: every client may connect and use every topic
}

func (h *limits) ID() string { return "ferrymq-gateway" }

func (h *limits) Provides(b byte) bool {
	if h.allowAll && (b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck) {
		return true
	}
	return bytes.Contains([]byte{mqtt.OnConnect, mqtt.OnSessionEstablished, mqtt.OnDisconnect}, []byte{b})
}

func (h *limits) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return h.allowAll }

func (h *limits) OnACLCheck(*mqtt.Client, string, bool) bool { return h.allowAll }

// OnConnect runs once CONNECT is decoded and valid, before the CONNACK.
func (h *limits) OnConnect(cl *mqtt.Client, _ packets.Packet) error {
	if c, ok := cl.Net.Conn.(*conn); ok {
		c.client.Store(cl)
	}
	max := h.g.opts.MaxKeepalive
	ka := cl.State.Keepalive
	switch {
	case ka > max:
		cl.State.Keepalive = max // MQTT 5 is told in CONNACK and must use it [MQTT-3.2.2-21]; MQTT 3 is held to it
		cl.State.ServerKeepalive = true
	case ka == 0 && cl.Properties.ProtocolVersion == 5:
		cl.State.Keepalive = max // no keepalive would leave a dead connection open forever
		cl.State.ServerKeepalive = true
	}
	return nil
}

func (h *limits) OnSessionEstablished(*mqtt.Client, packets.Packet) { h.g.m.connects.Inc() }

func (h *limits) OnDisconnect(_ *mqtt.Client, err error, _ bool) {
	h.g.m.disconnects.Inc()
}
