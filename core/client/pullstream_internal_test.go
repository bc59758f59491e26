package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/wire"
)

// TestStreamAnswerSplitByTheRoomAsked: an answer of a stream larger than
// what the consumer asks for next (its room shrank since it opened the
// stream) is handed over in parts, each starting where the one before
// ended, none lost or repeated. The answer is a real encoded pull result
// put where the session's reader puts it; no server is involved because
// which answers carry several messages depends on arrival timing.
func TestStreamAnswerSplitByTheRoomAsked(t *testing.T) {
	r := &remoteGroups{c: &Client{opts: Options{RequestTimeout: time.Second}}, streams: map[streamKey]*pullStream{}}
	k := streamKey{group: "g", clientID: "c", topic: "t"}
	st := &pullStream{answers: make(chan streamAnswer, 2), next: 10}
	r.streams[k] = st
	var msgs []*core.StoredMessage
	for o := int64(10); o < 15; o++ {
		msgs = append(msgs, &core.StoredMessage{Message: core.Message{Topic: "t", Body: []byte{byte(o)}}, QueueOffset: o})
	}
	payload, err := wire.EncodePull(wire.PullResult{Offset: 10, NextOffset: 15, Messages: msgs})
	require.NoError(t, err)
	st.answers <- streamAnswer{res: result{payload: payload}}

	var got []int64
	req := group.PullRequest{Group: "g", ClientID: "c", Queue: group.QueueRef{Topic: "t"}, Offset: 10, Max: 2, Wait: time.Second}
	for _, want := range []struct{ n, next int64 }{{2, 12}, {2, 14}, {1, 15}} {
		p, err := r.take(t.Context(), k, st, req)
		require.NoError(t, err)
		require.Len(t, p.Messages, int(want.n))
		require.Equal(t, req.Offset, p.Messages[0].QueueOffset, "a part starts where the one before ended")
		require.Equal(t, want.next, p.NextOffset)
		for _, m := range p.Messages {
			got = append(got, m.QueueOffset)
		}
		req.Offset = p.NextOffset
		require.Equal(t, p.NextOffset, st.next)
	}
	require.Equal(t, []int64{10, 11, 12, 13, 14}, got)
	require.Nil(t, st.rest)
}
