package rpc

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// FuzzParseResponse: any topic under $rpc/ a device publishes is parsed
// without panicking; what parses names a call ID and rebuilds the topic.
func FuzzParseResponse(f *testing.F) {
	for _, s := range []string{"$rpc/car-42/response/03000000000000000000000000000001", "$rpc/a/b/response/03000000000000000000000000000001",
		"$rpc//response/03000000000000000000000000000001", "$rpc/car/request/03000000000000000000000000000001", "$rpc/x/response/zz", "$rpc/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		client, id, err := parseResponse(topic)
		if err != nil {
			return
		}
		if id.Kind() != IDKindCall || client == "" {
			t.Fatalf("%q parsed to %q %v", topic, client, id)
		}
		if got := ResponseTopic(client, id.String()); !strings.EqualFold(got, topic) {
			t.Fatalf("%q rebuilt as %q", topic, got)
		}
	})
}

// FuzzDecodeNodeMessages: the headers and body of a message from another
// node decode or are refused, never panic; a decoded call is within the
// limits.
func FuzzDecodeNodeMessages(f *testing.F) {
	f.Add("1", "03000000000000000000000000000001", "car-42", "5000", "gw-1", "here", "fmqrpc.reply.gw", []byte("payload"))
	f.Add("1", "03000000000000000000000000000001", "a%2Fb", "-1", "gw%zz", "answer", "", []byte{})
	f.Add("2", "", "", "", "", "", "r", []byte(nil))
	f.Add("1", "03000000000000000000000000000001", "a+b", "99999999999999999999", "n", "bogus", "r", bytes.Repeat([]byte("x"), 64))
	f.Fuzz(func(t *testing.T, v, id, client, timeout, node, state, replyTo string, data []byte) {
		m := nats.NewMsg("fmqrpc.call")
		m.Reply = replyTo
		m.Header.Set(hdrVersion, v)
		m.Header.Set(hdrID, id)
		m.Header.Set(hdrClient, client)
		m.Header.Set(hdrTimeout, timeout)
		m.Header.Set(hdrNode, node)
		m.Header.Set(hdrState, state)
		m.Data = data
		if c, err := decodeCall(m, 32); err == nil {
			if c.timeout < 0 || c.timeout > MaxTimeout || len(c.payload) > 32 || checkClient(c.client) != nil {
				t.Fatalf("decoded out of bounds: %+v", c)
			}
		}
		if r, err := decodeReply(m); err == nil && r.state == "" {
			t.Fatalf("a reply without a state decoded")
		}
	})
}
