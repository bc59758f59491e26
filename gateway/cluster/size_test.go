package cluster_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// TestFourMiBBetweenNodes: a 4 MiB publish on node B reaches a subscriber
// on node A whole, through a nats-server with the max_payload ferrymq
// documents (8 MiB; natstest.MaxPayload), forwarded once and dropped never.
func TestFourMiBBetweenNodes(t *testing.T) {
	ns := natstest.RunServer(t)
	a := startNode(t, ns.URL, "gw-a", nodeOptions{})
	b := startNode(t, ns.URL, "gw-b", nodeOptions{})
	var got inbox
	sub3(t, dial3(t, a.addr, "car-a"), "cars/+/fw", 1, &got)
	waitInterest(t, ns, "fmqmqtt.cars.c1.fw", 1)

	body := strings.Repeat("0123456789abcdef", (4<<20)/16)
	pub3(t, dial3(t, b.addr, "car-b"), "cars/c1/fw", 1, false, body)
	require.Eventually(t, func() bool { return len(got.get()) == 1 }, 30*time.Second, 10*time.Millisecond)
	require.True(t, got.get()[0].body == body, "the 4 MiB message whole (%d bytes)", len(got.get()[0].body))
	require.Equal(t, 1.0, value(collector(t, b.r, "ferrymq_cluster_forwarded_total")))
	require.Zero(t, value(collector(t, b.r, "ferrymq_cluster_dropped_total")))
}
