package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/wire"
)

// TestBinaryFourMiBEveryPath is issue #21 on the real binary with no
// configuration at all: a 4 MiB body (core.MaxBodyBytes) published by an
// MQTT 3.1.1 device is read back whole over HTTP (query by client) and the
// wire protocol (pull); 4 MiB commands produced over HTTP (raw body) and
// over the wire reach MQTT devices whole.
func TestBinaryFourMiBEveryPath(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	srv := startServe(t, bin, "--data", filepath.Join(t.TempDir(), "data"))
	a := printedAddrs(t, srv, "tcp", "core", "http")
	body := func(seed byte) []byte {
		b := make([]byte, core.MaxBodyBytes)
		for i := range b {
			b[i] = seed + byte(i%241)
		}
		return b
	}
	got := make(chan []byte, 2)
	device := func(id string) paho3.Client {
		c := dialMQTT(t, a["tcp"], id, func(o *paho3.ClientOptions) {
			o.SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { got <- m.Payload() })
		})
		t.Cleanup(func() { c.Disconnect(100) })
		return c
	}
	car1, car2 := device("car-1"), device("car-2")
	tok := car1.Subscribe("cars/car-1/cmd", 1, nil)
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())

	// Uplink: MQTT → core, read back over HTTP and the wire.
	up := body(1)
	tok = car1.Publish("telemetry/car-1", 1, false, up)
	require.True(t, tok.WaitTimeout(30*time.Second), "PUBACK")
	require.NoError(t, tok.Error())
	resp, err := http.Get("http://" + a["http"] + "/api/v1/messages?client=car-1")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%.300s", b)
	var page struct {
		Messages []struct {
			ID          string `json:"id"`
			Queue       int    `json:"queue"`
			QueueOffset int64  `json:"queue_offset"`
			BodyBase64  string `json:"body_base64"`
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal(b, &page))
	require.Len(t, page.Messages, 1)
	m := page.Messages[0]
	hb, err := base64.StdEncoding.DecodeString(m.BodyBase64)
	require.NoError(t, err)
	require.True(t, bytes.Equal(up, hb), "HTTP: the body whole")

	c, err := client.Dial(t.Context(), client.Options{Addr: a["core"]})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	pr, err := c.Pull(t.Context(), "telemetry", m.Queue, m.QueueOffset, 32, 0)
	require.NoError(t, err)
	require.NotEmpty(t, pr.Messages)
	require.True(t, bytes.Equal(up, pr.Messages[0].Body), "wire: the body whole")

	// Downlink: core → MQTT, produced over HTTP and over the wire.
	viaHTTP := body(2)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+a["http"]+"/api/v1/topics/commands/messages", bytes.NewReader(viaHTTP))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("X-Ferrymq-Key", "car-2")
	req.Header.Set("X-Ferrymq-Prop-Mqtt.clientid", "car-2")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", b)
	viaWire := body(3)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = c.NewProducer().Send(ctx, &core.Message{Topic: "commands", ShardingKey: "car-1",
		Properties: map[string]string{"mqtt.topic": "cars/car-1/cmd"}, Body: viaWire})
	require.NoError(t, err)
	want := map[byte][]byte{2: viaHTTP, 3: viaWire}
	for range 2 {
		select {
		case p := <-got:
			require.Len(t, p, core.MaxBodyBytes)
			require.True(t, bytes.Equal(want[p[0]], p), "MQTT: the command whole")
			delete(want, p[0])
		case <-time.After(30 * time.Second):
			t.Fatalf("devices did not get the 4 MiB commands (%d missing)", len(want))
		}
	}
	require.True(t, car2.IsConnected())
	srv.interrupt(t)
}

// TestBinaryMessageSizeSettings: each path's limit is the setting
// docs/gateway.md names for it — set lower in a config file, each is what
// that path enforces and says: mqtt.max_packet_bytes (MQTT 5 CONNACK's
// Maximum Packet Size), core.max_frame_bytes (the hello's max_frame; the
// Go client refuses a larger request), store.max_message_bytes (error 12
// over the wire), http.max_body_bytes (413 body_too_large).
func TestBinaryMessageSizeSettings(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ferrymq.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("store: {max_message_bytes: 1048576}\ncore: {max_frame_bytes: 2097152}\n"+
		"http: {max_body_bytes: 524288}\nmqtt: {max_packet_bytes: 262144}\n"), 0o644))
	srv := startServe(t, bin, "--config", cfg, "--data", filepath.Join(dir, "data"))
	a := printedAddrs(t, srv, "tcp", "core", "http")

	conn, err := net.DialTimeout("tcp", a["tcp"], 5*time.Second)
	require.NoError(t, err)
	v5 := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ca, err := v5.Connect(ctx, &paho.Connect{ClientID: "car-5", KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	require.NotNil(t, ca.Properties.MaximumPacketSize)
	require.Equal(t, uint32(262144), *ca.Properties.MaximumPacketSize, "mqtt.max_packet_bytes")
	_ = v5.Disconnect(&paho.Disconnect{})
	<-v5.Done()

	c, err := client.Dial(t.Context(), client.Options{Addr: a["core"]})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	p := c.NewProducer()
	_, err = p.Send(ctx, &core.Message{Topic: "t", Body: make([]byte, 3<<20)})
	require.ErrorIs(t, err, wire.ErrFrameTooLarge)
	require.ErrorContains(t, err, "the server's limit 2097152", "core.max_frame_bytes")
	_, err = p.Send(ctx, &core.Message{Topic: "t", Body: make([]byte, 1536<<10)})
	require.ErrorIs(t, err, core.ErrMessageTooLarge)
	require.ErrorContains(t, err, "limit 1048576 (store.max_message_bytes)")
	_, err = p.Send(ctx, &core.Message{Topic: "t", Body: make([]byte, 1000<<10)})
	require.NoError(t, err)

	resp, err := http.Post("http://"+a["http"]+"/api/v1/topics/t/messages", "application/octet-stream", bytes.NewReader(make([]byte, 600<<10)))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	require.JSONEq(t, `{"error":"request body larger than 524288 bytes","code":"body_too_large"}`, string(b), "http.max_body_bytes")
	srv.interrupt(t)
}
