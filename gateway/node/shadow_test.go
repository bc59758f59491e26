package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/gateway/node"
	"github.com/ferrymq/ferrymq/gateway/shadowmqtt"
)

// mqttMsg is what a device was sent.
type mqttMsg struct {
	topic   string
	payload []byte
}

// device is a real MQTT client (3.1.1 or 5) that records what it is sent
// and publishes shadow requests.
type device struct {
	t   testing.TB
	id  string
	got chan mqttMsg
	// publish sends a QoS 1 publish; err is the refusal (MQTT 5: the
	// PUBACK's code; MQTT 3.1.1: the lost connection).
	publish func(topic string, payload []byte) error
	close   func()
}

func newDevice(t testing.TB, id string) *device {
	return &device{t: t, id: id, got: make(chan mqttMsg, 64)}
}

// connectV5 connects d with paho.golang (MQTT 5), clean start.
func (d *device) connectV5(addr net.Addr) *device {
	t := d.t
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
	require.NoError(t, err)
	c := paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) {
			d.got <- mqttMsg{topic: pr.Packet.Topic, payload: pr.Packet.Payload}
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: d.id, KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	require.Equal(t, byte(0), ca.ReasonCode)
	d.publish = func(topic string, payload []byte) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: payload})
		return err
	}
	d.close = func() {
		_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
		<-c.Done()
	}
	return d
}

// connectV3 connects d with paho.mqtt.golang (MQTT 3.1.1), clean session.
func (d *device) connectV3(addr net.Addr) *device {
	t := d.t
	t.Helper()
	lost := make(chan error, 1)
	o := paho3.NewClientOptions().AddBroker("tcp://" + addr.String()).SetClientID(d.id).SetCleanSession(true).
		SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4).SetKeepAlive(30 * time.Second).
		SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) {
			d.got <- mqttMsg{topic: m.Topic(), payload: m.Payload()}
		}).
		SetConnectionLostHandler(func(_ paho3.Client, err error) { lost <- err })
	c := paho3.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	d.publish = func(topic string, payload []byte) error {
		tok := c.Publish(topic, 1, false, payload)
		select {
		case <-tok.Done():
			return tok.Error()
		case err := <-lost:
			return fmt.Errorf("connection lost: %w", err)
		case <-time.After(10 * time.Second):
			return fmt.Errorf("publish to %s: no PUBACK", topic)
		}
	}
	d.close = func() { c.Disconnect(100) }
	return d
}

// next returns the next message d was sent on topic (skipping others).
func (d *device) next(topic string) []byte {
	d.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-d.got:
			if m.topic == topic {
				return m.payload
			}
		case <-deadline:
			d.t.Fatalf("%s: nothing on %s", d.id, topic)
			return nil
		}
	}
}

// request publishes a shadow request and returns the answer on
// <topic>/accepted or <topic>/rejected.
func (d *device) request(op string, body string) (accepted bool, payload []byte) {
	d.t.Helper()
	topic := shadowmqtt.Prefix + d.id + "/" + op
	require.NoError(d.t, d.publish(topic, []byte(body)))
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-d.got:
			switch m.topic {
			case topic + "/accepted":
				return true, m.payload
			case topic + "/rejected":
				return false, m.payload
			}
		case <-deadline:
			d.t.Fatalf("%s: no answer to %s", d.id, topic)
		}
	}
}

func decodeDoc(t testing.TB, b []byte) *shadow.Document {
	t.Helper()
	d, err := shadow.DecodeDocument(b)
	require.NoError(t, err, "%s", b)
	return d
}

func decodeRejected(t testing.TB, b []byte) shadowmqtt.Rejected {
	t.Helper()
	var r shadowmqtt.Rejected
	require.NoError(t, json.Unmarshal(b, &r))
	return r
}

func decodeDelta(t testing.TB, b []byte) shadowmqtt.Delta {
	t.Helper()
	var d shadowmqtt.Delta
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&d))
	return d
}

// patchShadow PATCHes a device's desired state through a node's admin API.
func patchShadow(t testing.TB, n *node.Node, id, body string) (int, []byte) {
	t.Helper()
	code, b := httpDo(t, n, http.MethodPatch, "/api/v1/devices/"+id+"/shadow", body)
	return code, []byte(b)
}

// shadowNode starts an embedded node with device shadows.
func shadowNode(t *testing.T) *node.Node {
	t.Helper()
	o := options(t)
	o.Shadows = &shadow.Options{}
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	return n
}

// shadowsStory is the story both engines tell: a backend (HTTP and the Go
// client) and devices (MQTT 5 and 3.1.1) update one shadow each from both
// sides; deltas arrive when desired changes and at reconnect; stale
// versions conflict everywhere; bad requests are refused with their code;
// a device cannot touch another's shadow. front and back are the nodes the
// devices and the backend use (the same node, or two).
func shadowsStory(t *testing.T, front, back *node.Node) {
	ctx := t.Context()
	c, err := client.Dial(ctx, client.Options{Addr: back.CoreAddr().String(), Token: back.Token()})
	require.NoError(t, err)
	defer c.Close()

	for _, v := range []struct {
		proto   string
		connect func(*device, net.Addr) *device
	}{{"v5", (*device).connectV5}, {"v3", (*device).connectV3}} {
		t.Run(v.proto, func(t *testing.T) {
			id := "car-" + v.proto
			dev := v.connect(newDevice(t, id), front.Addr("tcp"))

			ok, body := dev.request("get", "")
			require.False(t, ok)
			require.Equal(t, 404, decodeRejected(t, body).Code)

			// The device reports; the backend wants something else.
			ok, body = dev.request("update", `{"state":{"reported":{"temp":18,"fw":"1.0"}},"client_token":"r1"}`)
			require.True(t, ok, "%s", body)
			require.Contains(t, string(body), `"client_token":"r1"`)
			require.Equal(t, int64(1), decodeDoc(t, body).Version)

			code, body := patchShadow(t, back, id, `{"state":{"desired":{"temp":21}},"version":1}`)
			require.Equal(t, http.StatusOK, code, "%s", body)
			require.Equal(t, int64(2), decodeDoc(t, body).Version)
			delta := decodeDelta(t, dev.next(shadowmqtt.Prefix+id+"/update/delta"))
			require.Equal(t, int64(2), delta.Version)
			require.Equal(t, map[string]any{"temp": json.Number("21")}, delta.State)

			// A stale version: the backend's (HTTP and wire) and the device's.
			code, body = patchShadow(t, back, id, `{"state":{"desired":{"temp":22}},"version":1}`)
			require.Equal(t, http.StatusConflict, code)
			require.Contains(t, string(body), `"version_conflict"`)
			_, err := c.UpdateShadow(ctx, id, json.RawMessage(`{"temp":22}`), 1)
			require.ErrorIs(t, err, shadow.ErrVersionConflict)
			ok, body = dev.request("update", `{"state":{"reported":{"temp":19}},"version":1,"client_token":"r2"}`)
			require.False(t, ok)
			rej := decodeRejected(t, body)
			require.Equal(t, 409, rej.Code)
			require.Equal(t, "r2", rej.ClientToken)

			// Bad requests get their code; the connection stays.
			for _, bad := range []struct {
				body string
				code int
			}{
				{`{"state":`, 400},
				{`{"state":{"desired":{"x":1}}}`, 400},
				{`{"state":{"reported":{"blob":"` + strings.Repeat("b", 9000) + `"}}}`, 413},
			} {
				ok, body = dev.request("update", bad.body)
				require.False(t, ok)
				require.Equal(t, bad.code, decodeRejected(t, body).Code, "%s", body)
			}
			code, _ = patchShadow(t, back, id, `{"state":{"desired":[1]}}`)
			require.Equal(t, http.StatusBadRequest, code)
			code, _ = patchShadow(t, back, id, `{"state":{"desired":{"blob":"`+strings.Repeat("b", 8500)+`"}}}`)
			require.Equal(t, http.StatusRequestEntityTooLarge, code)

			// The device catches up with the current version.
			ok, body = dev.request("update", `{"state":{"reported":{"temp":21}},"version":2}`)
			require.True(t, ok, "%s", body)
			doc := decodeDoc(t, body)
			require.Equal(t, int64(3), doc.Version)
			require.Nil(t, doc.State.Delta)

			// Offline, the backend changes desired over the wire; at
			// reconnect (to the backend's node) the device gets the delta.
			dev.close()
			d, err := c.UpdateShadow(ctx, id, json.RawMessage(`{"fw":"2.0"}`), 3)
			require.NoError(t, err)
			require.Equal(t, int64(4), d.Version)
			dev = v.connect(newDevice(t, id), back.Addr("tcp")) // with two nodes, the other one
			defer dev.close()
			delta = decodeDelta(t, dev.next(shadowmqtt.Prefix+id+"/update/delta"))
			require.Equal(t, int64(4), delta.Version)
			require.Equal(t, map[string]any{"fw": "2.0"}, delta.State)

			ok, body = dev.request("get", `{"client_token":"g1"}`)
			require.True(t, ok)
			require.Contains(t, string(body), `"client_token":"g1"`)
			got := decodeDoc(t, body)
			require.Equal(t, int64(4), got.Version)
			require.Equal(t, map[string]any{"temp": json.Number("21"), "fw": "2.0"}, got.State.Desired)

			// Another device's shadow is refused: MQTT 5 gets the code,
			// an MQTT 3.1.1 client loses its connection.
			err = dev.publish(shadowmqtt.Prefix+"someone-else/update", []byte(`{"state":{"reported":{"x":1}}}`))
			require.Error(t, err)
			_, err = c.Shadow(ctx, "someone-else")
			require.ErrorIs(t, err, shadow.ErrNotFound, "nothing was written")
		})
	}
}

// TestShadowsOverMQTTAndBackends: the story on one embedded node, then
// the topic device-shadows holds every accepted change in version order.
func TestShadowsOverMQTTAndBackends(t *testing.T) {
	n := shadowNode(t)
	defer shutdown(t, n)
	shadowsStory(t, n, n)
	code, metrics := httpGet(t, n, "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, metrics, `ferrymq_shadow_requests_total{outcome="conflict",section="desired"} 4`, "two per device: HTTP and wire")
	require.Contains(t, metrics, `ferrymq_shadow_mqtt_sends_total{kind="connect",outcome="sent"} 2`)

	for _, id := range []string{"car-v5", "car-v3"} {
		msgs, err := n.Broker().FindByKey(t.Context(), shadow.DefaultTopic, id, core.KeyQuery{Max: 100})
		require.NoError(t, err)
		require.Len(t, msgs, 4, "%s: four accepted changes", id)
		for i, m := range msgs {
			ev, err := shadow.DecodeEvent(m.Body)
			require.NoError(t, err)
			require.Equal(t, int64(i+1), ev.Version)
		}
	}
}

// TestShadowDeleteOverHTTP: DELETE /api/v1/devices/{id}/shadow takes an
// optional expected version; a stale one conflicts, a malformed one or an
// unknown query parameter is refused before anything is deleted.
func TestShadowDeleteOverHTTP(t *testing.T) {
	n := shadowNode(t)
	defer shutdown(t, n)
	for _, body := range []string{`{"state":{"desired":{"temp":20}}}`, `{"state":{"desired":{"temp":21}}}`} {
		code, b := patchShadow(t, n, "car-1", body)
		require.Equal(t, http.StatusOK, code, "%s", b)
	}
	del := func(query string) (int, string) {
		return httpDo(t, n, http.MethodDelete, "/api/v1/devices/car-1/shadow"+query, "")
	}
	for _, bad := range []string{"?versoin=2", "?version=two", "?version=-1", "?version=2&version=2"} {
		code, body := del(bad)
		require.Equal(t, http.StatusBadRequest, code, "%s: %s", bad, body)
	}
	code, body := del("?version=1")
	require.Equal(t, http.StatusConflict, code, "%s", body)
	require.Contains(t, body, `"version_conflict"`)
	code, body = del("?version=2")
	require.Equal(t, http.StatusOK, code, "%s", body)
	_, err := n.Shadows().Get(t.Context(), "car-1")
	require.ErrorIs(t, err, shadow.ErrNotFound)
}

// TestShadowsAcrossTwoNATSNodes: two nodes on one nats-server share the
// bucket; devices connect to one, the backend talks to the other: deltas
// cross from the node that took the change to the node holding the
// device, and versions conflict across nodes.
func TestShadowsAcrossTwoNATSNodes(t *testing.T) {
	ns := natstest.RunServer(t)
	start := func(name string) *node.Node {
		o := natsOptions(t, ns.URL, name)
		o.Shadows = &shadow.Options{}
		n, err := node.New(t.Context(), o, nil)
		require.NoError(t, err)
		return n
	}
	n1 := start("gw-1")
	defer shutdown(t, n1)
	n2 := start("gw-2")
	defer shutdown(t, n2)
	shadowsStory(t, n1, n2)
}

// TestShadowsUnderTheACL: with ACL rules, a device's shadow requests are
// publishes like any other (checked), and answers and deltas reach it
// only if it may read their topics: a device allowed to publish updates
// but not to read $shadow/ has them accepted and hears nothing; its get,
// not allowed, is refused.
func TestShadowsUnderTheACL(t *testing.T) {
	o := options(t)
	o.Shadows = &shadow.Options{}
	o.Auth = &node.AuthOptions{Anonymous: true, ACL: []auth.ACLRule{
		{Action: "allow", Clients: []string{"reader"}, Publish: []string{"$shadow/%c/update", "$shadow/%c/get"}, Subscribe: []string{"$shadow/%c/#"}},
		{Action: "allow", Clients: []string{"blind"}, Publish: []string{"$shadow/%c/update"}, Subscribe: []string{"devices/%c/#"}},
	}}
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	defer shutdown(t, n)

	reader := newDevice(t, "reader").connectV5(n.Addr("tcp"))
	defer reader.close()
	ok, body := reader.request("update", `{"state":{"reported":{"on":true}}}`)
	require.True(t, ok, "%s", body)
	ok, _ = reader.request("get", "")
	require.True(t, ok)

	blind := newDevice(t, "blind").connectV5(n.Addr("tcp"))
	defer blind.close()
	require.NoError(t, blind.publish(shadowmqtt.Prefix+"blind/update", []byte(`{"state":{"reported":{"on":true}}}`)))
	require.Eventually(t, func() bool {
		d, err := n.Shadows().Get(t.Context(), "blind")
		return err == nil && d.Version == 1
	}, 5*time.Second, 10*time.Millisecond, "the update is accepted")
	_, err = n.Shadows().Update(t.Context(), "blind", shadow.Update{Section: shadow.Desired, Patch: map[string]any{"on": false}})
	require.NoError(t, err)
	require.Error(t, blind.publish(shadowmqtt.Prefix+"blind/get", nil), "the ACL refuses the get")
	require.Never(t, func() bool { return len(blind.got) > 0 }, 300*time.Millisecond, 10*time.Millisecond,
		"no answer nor delta reaches a device that may not read $shadow/")
}

// TestShadowWillReportsOffline: a will on $shadow/<id>/update is applied
// like the device's own update when its connection drops: a device can
// have its shadow say it is offline.
func TestShadowWillReportsOffline(t *testing.T) {
	n := shadowNode(t)
	defer shutdown(t, n)

	conn, err := net.DialTimeout("tcp", n.Addr("tcp").String(), 5*time.Second)
	require.NoError(t, err)
	c := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: "lamp-1", KeepAlive: 30, CleanStart: true, WillMessage: &paho.WillMessage{
		Topic: shadowmqtt.Prefix + "lamp-1/update", QoS: 1, Payload: []byte(`{"state":{"reported":{"online":false}}}`)}})
	require.NoError(t, err)
	require.Equal(t, byte(0), ca.ReasonCode)
	_, err = c.Publish(ctx, &paho.Publish{Topic: shadowmqtt.Prefix + "lamp-1/update", QoS: 1, Payload: []byte(`{"state":{"reported":{"online":true}}}`)})
	require.NoError(t, err)
	require.NoError(t, conn.Close()) // no DISCONNECT: the will is due
	<-c.Done()
	require.Eventually(t, func() bool {
		d, err := n.Shadows().Get(t.Context(), "lamp-1")
		return err == nil && d.Version == 2 && d.State.Reported["online"] == false
	}, 10*time.Second, 10*time.Millisecond, "the will reported the device offline")
}
