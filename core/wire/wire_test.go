package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/txn"
)

func sample() []*core.Message {
	return []*core.Message{
		{Topic: "t", Body: nil},
		{Topic: "orders", ShardingKey: "car-42", Tag: "alarm", Keys: []string{"o-1", "o-2"},
			Properties: map[string]string{"mqtt.topic": "cars/42/alarm", "a": ""}, Body: []byte("hello"),
			DeliverAt: time.Unix(1_800_000_000, 5)},
	}
}

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	in := []Frame{{Op: OpHello, ID: 1, Payload: []byte(`{"version":1}`)}, {Op: OpPing, Flags: FlagResponse, ID: 1<<63 + 7}}
	for _, f := range in {
		buf.Write(AppendFrame(nil, f))
	}
	for _, want := range in {
		got, err := ReadFrame(&buf, DefaultMaxFrame)
		require.NoError(t, err)
		require.Equal(t, want.Op, got.Op)
		require.Equal(t, want.Flags, got.Flags)
		require.Equal(t, want.ID, got.ID)
		require.Equal(t, len(want.Payload), len(got.Payload))
	}
	_, err := ReadFrame(&buf, DefaultMaxFrame)
	require.ErrorIs(t, err, io.EOF)
}

func TestReadFrameRejects(t *testing.T) {
	cases := map[string]struct {
		b    []byte
		want error
	}{
		"huge length":      {[]byte{0x7F, 0xFF, 0xFF, 0xFF}, ErrFrameTooLarge},
		"short length":     {[]byte{0, 0, 0, 3, 1, 2, 3}, ErrBadFrame},
		"truncated header": {[]byte{0, 0, 0, 12, 1}, io.ErrUnexpectedEOF},
		"truncated body":   {AppendFrame(nil, Frame{Op: OpPing, Payload: []byte("abcdef")})[:18], io.ErrUnexpectedEOF},
		"reserved set":     {[]byte{0, 0, 0, 12, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, ErrBadFrame},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(c.b), 1<<20)
			require.ErrorIs(t, err, c.want)
		})
	}
}

func TestProduceRoundTrip(t *testing.T) {
	p, err := EncodeProduce(sample())
	require.NoError(t, err)
	got, err := DecodeProduce(p)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, sample()[1].Properties, got[1].Properties)
	require.Equal(t, sample()[1].Keys, got[1].Keys)
	require.Equal(t, "hello", string(got[1].Body))
	require.True(t, sample()[1].DeliverAt.Equal(got[1].DeliverAt))
	require.True(t, got[0].DeliverAt.IsZero())
	for cut := 0; cut < len(p); cut++ {
		_, err := DecodeProduce(p[:cut])
		require.ErrorIs(t, err, ErrBadPayload, "cut at %d", cut)
	}
	_, err = DecodeProduce(append(p, 0))
	require.ErrorIs(t, err, ErrBadPayload)
	_, err = EncodeProduce(nil)
	require.Error(t, err)
}

func TestStoredPullPopRoundTrip(t *testing.T) {
	m := &core.StoredMessage{Message: *sample()[1], ID: core.NewCommitLogID(7, 4096, 300), Queue: 3, QueueOffset: 99,
		StoredAt: time.Unix(1_700_000_000, 1)}
	m.BornAt = time.Unix(1_700_000_000, 0)
	m.ReconsumeCount = 2
	pr := PullResult{NextOffset: 100, Offset: 99, Range: core.QueueRange{Min: 1, Max: 100}, Reset: true, Messages: []*core.StoredMessage{m}}
	b, err := EncodePull(pr)
	require.NoError(t, err)
	got, err := DecodePull(b)
	require.NoError(t, err)
	require.Equal(t, pr.NextOffset, got.NextOffset)
	require.True(t, got.Reset)
	require.False(t, got.Clamped)
	require.Equal(t, m.ID, got.Messages[0].ID)
	require.Equal(t, 2, got.Messages[0].ReconsumeCount)
	require.Equal(t, int64(4096), got.Messages[0].CommitLogOffset)

	pb, err := EncodePopped([]Popped{{Message: m, Handle: "h1", Attempt: 3}})
	require.NoError(t, err)
	ps, err := DecodePopped(pb)
	require.NoError(t, err)
	require.Equal(t, "h1", ps[0].Handle)
	require.Equal(t, 3, ps[0].Attempt)

	sb := EncodeSendResults([]core.SendResult{{ID: m.ID, Queue: 3, QueueOffset: 99, StoredAt: m.StoredAt}})
	sr, err := DecodeSendResults(sb)
	require.NoError(t, err)
	require.Equal(t, m.ID, sr[0].ID)
	require.Equal(t, int64(99), sr[0].QueueOffset)
}

func TestErrorCodes(t *testing.T) {
	for _, e := range []error{core.ErrTopicNotFound, group.ErrQueueBusy, core.ErrStoreFailed} {
		code := CodeOf(e)
		we := DecodeError(EncodeError(code, e.Error()))
		require.True(t, errors.Is(we, e), "%v survives the wire", e)
	}
	require.Equal(t, CodeInternal, CodeOf(errors.New("boom")))
	require.True(t, (&Error{Code: CodeShuttingDown}).Retryable())
	require.False(t, (&Error{Code: CodeTopicNotFound}).Retryable())
	require.Equal(t, CodeBadFrame, DecodeError(nil).Code)
}

func FuzzReadFrame(f *testing.F) {
	f.Add(AppendFrame(nil, Frame{Op: OpHello, ID: 1, Payload: []byte(`{"version":1}`)}))
	f.Add([]byte{0x7F, 0xFF, 0xFF, 0xFF})
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ReadFrame(bytes.NewReader(b), 1<<16)
		if err != nil {
			return
		}
		again := AppendFrame(nil, fr)
		if !bytes.Equal(again, b[:len(again)]) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func FuzzDecodeMessages(f *testing.F) {
	p, _ := EncodeProduce(sample())
	f.Add(p)
	m := &core.StoredMessage{Message: *sample()[1]}
	pb, _ := EncodePull(PullResult{Messages: []*core.StoredMessage{m}})
	f.Add(pb)
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF})
	h, _ := EncodeTxnHalf("billing", sample()[0])
	f.Add(h)
	f.Fuzz(func(t *testing.T, b []byte) {
		if msgs, err := DecodeProduce(b); err == nil {
			if _, err := EncodeProduce(msgs); err != nil {
				t.Fatalf("decoded produce does not re-encode: %v", err)
			}
		}
		_, _ = DecodePull(b)
		_, _ = DecodePopped(b)
		_, _ = DecodeStored(b)
		_, _ = DecodeSendResults(b)
		_ = DecodeError(b)
		_, _, _ = DecodeQuery(b)
		if g, m, err := DecodeTxnHalf(b); err == nil {
			if _, err := EncodeTxnHalf(g, m); err != nil {
				t.Fatalf("decoded half message does not re-encode: %v", err)
			}
		}
	})
}

// The example in docs/wire-protocol.md: producing one message {topic
// "hello", body "hi"} is a frame of length 0x2c.
func TestDocumentedProduceExample(t *testing.T) {
	p, err := EncodeProduce([]*core.Message{{Topic: "hello", Body: []byte("hi")}})
	require.NoError(t, err)
	f := AppendFrame(nil, Frame{Op: OpProduce, ID: 2, Payload: p})
	require.Equal(t, []byte{0, 0, 0, 0x2c, 0x10, 0, 0, 0}, f[:8])
	require.Equal(t, []byte{0, 0, 0, 1, 5, 'h', 'e', 'l', 'l', 'o'}, f[16:26])
	r := EncodeSendResults([]core.SendResult{{}})
	require.Len(t, AppendFrame(nil, Frame{Payload: r}), 4+0x34)
}

func TestTxnHalfRoundTrip(t *testing.T) {
	m := sample()[1]
	p, err := EncodeTxnHalf("orders-svc", m)
	require.NoError(t, err)
	g, got, err := DecodeTxnHalf(p)
	require.NoError(t, err)
	require.Equal(t, "orders-svc", g)
	require.Equal(t, m.Topic, got.Topic)
	require.Equal(t, m.Body, got.Body)
	_, _, err = DecodeTxnHalf(p[:len(p)-1])
	require.ErrorIs(t, err, ErrBadPayload)
	_, _, err = DecodeTxnHalf(append(p, 0))
	require.ErrorIs(t, err, ErrBadPayload)
	_, _, err = DecodeTxnHalf(append([]byte{0}, p[1+len("orders-svc"):]...))
	require.ErrorIs(t, err, ErrBadPayload)
	_, err = EncodeTxnHalf("", m)
	require.Error(t, err)
}

func TestSendResultQueueMinusOne(t *testing.T) {
	res, err := DecodeSendResults(EncodeSendResults([]core.SendResult{{Queue: -1, QueueOffset: -1}}))
	require.NoError(t, err)
	require.Equal(t, -1, res[0].Queue)
	require.EqualValues(t, -1, res[0].QueueOffset)
}

// Codes shared by several packages' errors match each of them.
func TestErrorUnwrapsEverySentinelOfItsCode(t *testing.T) {
	e := &Error{Code: CodeInvalidGroup}
	require.ErrorIs(t, e, group.ErrInvalidGroup)
	require.ErrorIs(t, e, txn.ErrInvalidGroup)
	require.ErrorIs(t, e, retry.ErrInvalidGroup)
	b := &Error{Code: CodeBadRequest}
	require.ErrorIs(t, b, ErrBadPayload)
	require.ErrorIs(t, b, txn.ErrInvalidAction)
	require.NotErrorIs(t, b, txn.ErrInvalidGroup)
}

func TestQueryRoundTrip(t *testing.T) {
	m := &core.StoredMessage{Message: *sample()[1]}
	p, err := EncodeQuery("123-456", []*core.StoredMessage{m})
	require.NoError(t, err)
	next, msgs, err := DecodeQuery(p)
	require.NoError(t, err)
	require.Equal(t, "123-456", next)
	require.Len(t, msgs, 1)
	require.Equal(t, m.Body, msgs[0].Body)
	_, _, err = DecodeQuery(p[:1])
	require.ErrorIs(t, err, ErrBadPayload)
}
