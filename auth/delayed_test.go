package auth

import (
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// A delayed publish "$delayed/{seconds}/{topic}" is checked as a publish to
// {topic}, deny rules included; a malformed one passes, for the bridge to
// refuse with its own reason code. Subscriptions and deliveries are not
// translated.
func TestHookDelayedPublishACL(t *testing.T) {
	acl, err := NewACL([]ACLRule{
		{Action: ActionDeny, Publish: []string{"cars/+/secret"}},
		{Action: ActionAllow, Publish: []string{"cars/%c/#"}, Subscribe: []string{"cars/%c/#"}},
	})
	require.NoError(t, err)
	hs := newHookServer(t, HookOptions{ACL: acl})
	cl, ok := hs.connect("c1", "", "", true)
	require.True(t, ok)

	for _, tc := range []struct {
		topic string
		write bool
		want  bool
	}{
		{"$delayed/1/cars/c1/x", true, true},
		{"$delayed/0/cars/c1", true, true},
		{"$delayed/3600/cars/c1/a/b", true, true},
		{"$delayed/1/cars/c2/x", true, false},
		{"$delayed/1/trucks/c1/x", true, false},
		{"$delayed/1/cars/c1/secret", true, false},
		{"$DELAYED/1/cars/c1/x", true, false}, // the prefix is case-sensitive: an ordinary '$' topic
		{"cars/c1/x", true, true},
		{"cars/c2/x", true, false},
		// Malformed: passed on to the bridge, which answers 0x90.
		{"$delayed/abc/cars/c2/x", true, true},
		{"$delayed/-1/cars/c2/x", true, true},
		{"$delayed/1/", true, true},
		{"$delayed/1/$SYS/x", true, true},
		// The internal namespace stays closed whatever the prefix.
		{"$ferrymq/p2p/c2", true, false},
		// Reading is not translated.
		{"$delayed/1/cars/c1/x", false, false},
		{"$delayed/#", false, false},
		{"cars/c1/#", false, true},
	} {
		require.Equal(t, tc.want, hs.h.OnACLCheck(cl, tc.topic, tc.write), "%s (write %v)", tc.topic, tc.write)
	}

	// OnPacketRead leaves a delayed topic as it is, so the check above is
	// what mochi asks.
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 1, TopicName: "$delayed/1/cars/c2/x"}
	out, err := hs.h.OnPacketRead(cl, pk)
	require.NoError(t, err)
	require.Equal(t, pk.TopicName, out.TopicName)
}
