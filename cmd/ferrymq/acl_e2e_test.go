package main

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A deny rule shields its topic from every subscription, including
// wildcards that are granted because they merely overlap it (Mosquitto's
// model, auth/acl.go): the subscription to devices/secret itself is
// refused; devices/+ is granted and gets devices/ok but never
// devices/secret — live, retained, or queued while the session is parked.
func TestBinaryACLDenyFiltersDeliveries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	cfg := filepath.Join(t.TempDir(), "ferrymq.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(`auth:
  anonymous: true
  acl:
    - {action: deny, subscribe: ["devices/secret"]}
    - {action: allow, publish: ["#"], subscribe: ["#"]}
bridge: {disable_events: true}
`), 0o600))
	srv := startServe(t, bin, "--config", cfg, "--data", filepath.Join(t.TempDir(), "data"))
	addrs := printedAddrs(t, srv, "tcp", "http")
	addr := addrs["tcp"]

	var mu sync.Mutex
	var got, dups []string
	gotTopics := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
	connect := func(id string, clean bool) paho3.Client {
		o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetCleanSession(clean).
			SetAutoReconnect(false).SetConnectRetry(false).SetResumeSubs(true).
			SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) {
				mu.Lock()
				defer mu.Unlock()
				s := m.Topic() + "=" + string(m.Payload())
				// A QoS 1 message whose PUBACK the disconnect cut off is
				// resent with DUP on the resumed session (at least once):
				// not a second delivery to count.
				if m.Duplicate() && slices.Contains(got, s) {
					dups = append(dups, s)
					return
				}
				got = append(got, s)
			})
		c := paho3.NewClient(o)
		tok := c.Connect()
		require.True(t, tok.WaitTimeout(10*time.Second))
		require.NoError(t, tok.Error())
		return c
	}
	subscribe := func(c paho3.Client, filter string) byte {
		tok := c.Subscribe(filter, 1, nil)
		require.True(t, tok.WaitTimeout(10*time.Second))
		require.NoError(t, tok.Error())
		return tok.(*paho3.SubscribeToken).Result()[filter]
	}
	pub := c3pub(t, connect("pub", true))

	pub("devices/secret", "retained-secret", true)
	pub("devices/ok", "retained-ok", true)

	sub := connect("watcher", false)
	require.Equal(t, byte(0x80), subscribe(sub, "devices/secret"), "the denied topic itself is refused")
	require.Equal(t, byte(1), subscribe(sub, "devices/+"), "an overlapping wildcard is granted")
	pub("devices/secret", "live-secret", false)
	pub("devices/ok", "live-ok", false)
	require.Eventually(t, func() bool { return len(gotTopics()) >= 2 }, 10*time.Second, 10*time.Millisecond)

	// Parked: the session leaves, its messages are queued on disk.
	sub.Disconnect(100)
	require.Eventually(t, clientShows(addrs["http"], "watcher", `"parked":true`), 10*time.Second, 20*time.Millisecond,
		"the watcher's session is parked")
	pub("devices/secret", "queued-secret", false)
	pub("devices/ok", "queued-ok", false)
	sub = connect("watcher", false)
	defer sub.Disconnect(100)
	require.Eventually(t, func() bool { return len(gotTopics()) >= 3 }, 10*time.Second, 10*time.Millisecond)
	more := func() bool { return len(gotTopics()) > 3 }
	if !assert.Never(t, more, 500*time.Millisecond, 10*time.Millisecond, "a message of the denied topic, or one twice, arrived") {
		t.Fatalf("received %v", gotTopics())
	}
	mu.Lock()
	for _, d := range dups {
		require.NotContains(t, d, "secret", "a resent message of the denied topic")
	}
	mu.Unlock()
	require.Equal(t, []string{"devices/ok=retained-ok", "devices/ok=live-ok", "devices/ok=queued-ok"}, gotTopics())
}

// c3pub returns a QoS 1 publisher on c that waits for each PUBACK.
func c3pub(t *testing.T, c paho3.Client) func(topic, payload string, retain bool) {
	t.Cleanup(func() { c.Disconnect(100) })
	return func(topic, payload string, retain bool) {
		tok := c.Publish(topic, 1, retain, payload)
		require.True(t, tok.WaitTimeout(10*time.Second))
		require.NoError(t, tok.Error())
	}
}
