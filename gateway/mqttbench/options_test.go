package mqttbench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDefaults(t *testing.T) {
	o := Options{}.withDefaults()
	require.Equal(t, ModePubSub, o.Mode)
	require.Equal(t, "tcp://127.0.0.1:1883", o.Addr)
	require.Equal(t, 3, o.Version)
	require.Equal(t, 10*time.Second, o.Duration, "a duration when no count is given")
	require.Equal(t, "bench/#", o.Filter)
	require.Equal(t, "127.0.0.1", o.Source.String(), "spread from 127.0.0.1 for a loopback broker")
	require.NoError(t, o.validate())

	require.Zero(t, Options{Count: 5}.withDefaults().Duration)
	require.False(t, Options{Addr: "tcp://192.0.2.1:1883"}.withDefaults().Source.IsValid(), "unbound for other brokers")
}

func TestDefaultFilter(t *testing.T) {
	for topic, want := range map[string]string{
		"bench/%i":              "bench/#",
		"telemetry/dev-%i/temp": "telemetry/#",
		"dev-%i/temp":           "#",
		"dev-%i":                "#",
		"single":                "single",
		"a/b":                   "a/#",
	} {
		require.Equal(t, want, defaultFilter(topic), topic)
	}
	require.Equal(t, "telemetry/dev-7/x", publisherTopic("telemetry/dev-%i/x", 7))
}

func TestParseAddr(t *testing.T) {
	for in, want := range map[string]brokerAddr{
		"127.0.0.1:1883":           {url: "tcp://127.0.0.1:1883", scheme: "tcp", hostport: "127.0.0.1:1883"},
		"tcp://127.0.0.1:1883":     {url: "tcp://127.0.0.1:1883", scheme: "tcp", hostport: "127.0.0.1:1883"},
		"mqtt://localhost:1883":    {url: "tcp://localhost:1883", scheme: "tcp", hostport: "localhost:1883"},
		"ws://127.0.0.1:8083/mqtt": {url: "ws://127.0.0.1:8083/mqtt", scheme: "ws", hostport: "127.0.0.1:8083", path: "/mqtt"},
		"ws://127.0.0.1:8083":      {url: "ws://127.0.0.1:8083", scheme: "ws", hostport: "127.0.0.1:8083", path: "/"},
		"tls://127.0.0.1:8883":     {url: "tls://127.0.0.1:8883", scheme: "tls", hostport: "127.0.0.1:8883"},
		"mqtts://localhost:8883":   {url: "tls://localhost:8883", scheme: "tls", hostport: "localhost:8883"},
	} {
		got, err := parseAddr(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"udp://127.0.0.1:1883", "tcp://127.0.0.1", "tcp://127.0.0.1:1883/mqtt", "://x"} {
		_, err := parseAddr(in)
		require.Error(t, err, in)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	err := Options{QoS: 3, SizeBytes: 8, Version: 4, Filter: "a/#/b", Topic: "a/+", Inflight: -1, Rate: -1,
		Core: CoreOptions{Addr: "127.0.0.1:10911"}}.withDefaults().validate()
	require.ErrorIs(t, err, ErrInvalidOptions)
	for _, want := range []string{"QoS 3", "payload size 8", "MQTT version 4", `filter "a/#/b"`, `topic "a/+"`, "inflight -1", "rate -1", "core consumer needs"} {
		require.ErrorContains(t, err, want)
	}

	err = Options{Mode: ModeIdle, Addr: "ws://127.0.0.1:1/mqtt", KeepAlive: 70_000 * time.Second, Password: "x",
		Subscribe: "a/#/b", SubQoS: 3}.withDefaults().validate()
	require.NotContains(t, err.Error(), "ws", "idle connections may be WebSockets")
	for _, want := range []string{"keepalive", "password needs a username", "subscribe:", "subscription QoS 3"} {
		require.ErrorContains(t, err, want)
	}
	err = Options{Addr: "tls://127.0.0.1:1", Username: "u"}.withDefaults().validate()
	require.ErrorContains(t, err, "tcp or ws only")
	require.ErrorContains(t, err, "for connect and idle modes")

	require.ErrorContains(t, Options{Mode: "storm"}.withDefaults().validate(), `mode "storm"`)
}
