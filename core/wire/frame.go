package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Version is the protocol version this package speaks.
const Version = 1

// HeaderLen is the size of a frame header, length field included.
const HeaderLen = 16

// DefaultMaxFrame bounds a frame unless the peers agree otherwise: 8 MiB,
// room for a produce or an answer of one message of the engines' default
// limit (core.DefaultMaxMessageBytes, a 4 MiB body and its envelope) twice
// over. A server announces its limit in the hello reply (max_frame).
const DefaultMaxFrame = 8 << 20

// Op is an operation code. These values are part of the protocol.
type Op uint8

const (
	OpHello   Op = 0x01 // JSON {version, token, client_id} → JSON {version, server, max_frame}
	OpPing    Op = 0x02 // empty → empty (either side may send it)
	OpProduce Op = 0x10 // binary messages → binary send results
	OpPull    Op = 0x20 // JSON {topic, queue, offset, max, wait_ms, tags} → binary pull result (no group)

	OpHeartbeat   Op = 0x21 // JSON group.HeartbeatRequest → JSON assignment
	OpGroupPull   Op = 0x22 // JSON {group, client_id, topic, queue, offset, max, wait_ms, stream} → binary pull result (with stream: one or more, FlagMore on all but the last)
	OpCommit      Op = 0x23 // JSON {group, client_id, topic, queue, offset} → empty
	OpRelease     Op = 0x24 // JSON {group, client_id, topic, queue} → empty
	OpLeave       Op = 0x25 // JSON {group, client_id} → empty
	OpSendBack    Op = 0x26 // JSON {group, id, reason} → JSON {outcome}   (nack: retry later)
	OpDeadLetter  Op = 0x27 // JSON {group, id, reason, reconsume} → empty
	OpPop         Op = 0x30 // JSON {group, topic, max, invisible_ms, wait_ms, orderly, tags} → binary popped
	OpAck         Op = 0x31 // JSON {handle} → empty
	OpChangeInvis Op = 0x32 // JSON {handle, invisible_ms} → JSON {handle}
	OpLag         Op = 0x40 // JSON {group, member} → JSON [queue lag]
	OpReset       Op = 0x41 // JSON {group, topic, time, latest} → JSON {offsets}
	OpGroups      Op = 0x42 // JSON {} → JSON [group info]: the groups this node serves
	OpTopicCreate Op = 0x50 // JSON {name, queues} → JSON topic info
	OpTopicList   Op = 0x51 // JSON {} → JSON [topic info]
	OpTopicGet    Op = 0x52 // JSON {name} → JSON topic info
	OpTopicDelete Op = 0x53 // JSON {name} → empty
	OpTopicResize Op = 0x54 // JSON {name, queues} → JSON topic info
	OpCluster     Op = 0x55 // JSON {} → JSON cluster info: the nodes and their core addresses (discovery)
	OpGet         Op = 0x60 // 16-byte message ID → binary messages (one)
	OpFindByKey   Op = 0x61 // JSON {topic, key, max, begin, end} → binary messages
	OpCancelDelay Op = 0x62 // JSON {id} → JSON delayed message
	OpListDelayed Op = 0x63 // JSON {topic, level, offset, max} → JSON {pending, next_level, next_offset, done}
	OpTrace       Op = 0x64 // JSON {id, max} → JSON [hop]: a message's end-to-end trace
	OpQuery       Op = 0x65 // JSON {topic, key, client, begin, end, max, cursor} → u16 cursor length, cursor, then as OpGet's response
	OpCheckTxn    Op = 0x70 // push (server → producer): binary stored messages (one half message) to resolve
	OpTxnHalf     Op = 0x71 // u8 group length, group, binary message → binary send results (one)
	OpTxnEnd      Op = 0x72 // JSON {id, group, action, from_check} → binary send results (one for a commit, else none)
	OpTxnRegister Op = 0x73 // JSON {groups} → empty: check-backs of exactly these producer groups may come here (replaces the connection's set)
	OpTxnList     Op = 0x74 // JSON {} → JSON [pending half message]
	// Device command and control (docs/commands.md).
	OpCall         Op = 0x80 // JSON {client_id, payload, timeout_ms} → JSON {payload, ...}: a synchronous call to a device
	OpShadowGet    Op = 0x81 // JSON {client_id} → JSON shadow document
	OpShadowUpdate Op = 0x82 // JSON {client_id, desired, version} → JSON shadow document
	OpShadowDelete Op = 0x83 // JSON {client_id, version} → empty
)

// Flags of a frame.
const (
	FlagResponse byte = 0x01
	FlagError    byte = 0x02
	FlagPush     byte = 0x04
	FlagNoReply  byte = 0x08
	// FlagMore marks a response after which more responses to the same
	// request follow (a streaming OpGroupPull); the last one has it clear.
	FlagMore byte = 0x10
)

// Frame is one protocol frame.
type Frame struct {
	Op      Op
	Flags   byte
	ID      uint64
	Payload []byte
}

// Errors of the frame codec.
var (
	// ErrFrameTooLarge is returned when a frame's length exceeds the limit
	// (by ReadFrame, then as a *LargeFrameError when the frame's header is
	// sound, whose payload the reader may skip), or by a client for a
	// request larger than the server's limit.
	ErrFrameTooLarge = errors.New("wire: frame too large")
	// ErrBadFrame is returned for a frame whose header is malformed.
	ErrBadFrame = errors.New("wire: malformed frame")
	// ErrBadPayload is returned when a payload does not decode.
	ErrBadPayload = errors.New("wire: malformed payload")
	// ErrNotEnabled is returned for an operation of a service the server
	// does not run (delayed delivery or transactions on a gateway without a
	// store).
	ErrNotEnabled = errors.New("wire: not enabled on this server")
	// ErrMoved is returned for an operation of a shard (a consumer group,
	// or the node-wide services) that another node of the cluster serves:
	// the error (a *Error, MovedTo) names it, and the client sends the
	// request there.
	ErrMoved = errors.New("wire: served by another node")
	// ErrDeviceNotConnected is returned for a call (OpCall) to a device no
	// gateway node has connected.
	ErrDeviceNotConnected = errors.New("wire: device not connected")
	// ErrDeviceTimeout is returned for a call the device did not answer in
	// time.
	ErrDeviceTimeout = errors.New("wire: device did not answer in time")
)

// AppendFrame appends f's encoding to dst.
func AppendFrame(dst []byte, f Frame) []byte {
	return append(AppendHeader(dst, f, len(f.Payload)), f.Payload...)
}

// AppendHeader appends the header of a frame whose payload of payloadLen
// bytes the caller writes next (to avoid copying large payloads).
func AppendHeader(dst []byte, f Frame, payloadLen int) []byte {
	var h [HeaderLen]byte
	binary.BigEndian.PutUint32(h[0:], uint32(HeaderLen-4+payloadLen))
	h[4] = byte(f.Op)
	h[5] = f.Flags
	binary.BigEndian.PutUint64(h[8:], f.ID)
	return append(dst, h[:]...)
}

// LargeFrameError is ReadFrame's error for a frame longer than its limit
// whose header is sound (reserved bytes zero, a known op): its payload has
// not been read, and Skip discards it, after which the stream is at the
// next frame. It unwraps to ErrFrameTooLarge.
type LargeFrameError struct {
	// Frame is the frame's header (no payload).
	Frame Frame
	// Len is the frame's length field (12 + payload), Max the limit.
	Len, Max int
}

func (e *LargeFrameError) Error() string {
	return fmt.Sprintf("%s: %d bytes, limit %d", ErrFrameTooLarge, e.Len, e.Max)
}

// Unwrap makes errors.Is(err, ErrFrameTooLarge) hold.
func (e *LargeFrameError) Unwrap() error { return ErrFrameTooLarge }

// Skip reads and discards the frame's payload from r, the reader ReadFrame
// read its header from, without buffering it.
func (e *LargeFrameError) Skip(r io.Reader) error {
	n := int64(e.Len - (HeaderLen - 4))
	if m, err := io.CopyN(io.Discard, r, n); err != nil {
		return fmt.Errorf("skip %d of a %d-byte payload: %w", m, n, unexpected(err))
	}
	return nil
}

// ReadFrame reads one frame from r, refusing frames longer than max before
// allocating anything: then the error is a *LargeFrameError if the frame's
// header is sound (the payload is left unread, for LargeFrameError.Skip),
// else it wraps ErrBadFrame or ErrFrameTooLarge and the stream cannot be
// resynchronised. The payload is freshly allocated (the caller owns it).
func ReadFrame(r io.Reader, max int) (Frame, error) {
	var h [HeaderLen]byte
	if _, err := io.ReadFull(r, h[:4]); err != nil {
		return Frame{}, err
	}
	n := int(binary.BigEndian.Uint32(h[:4]))
	if n < HeaderLen-4 {
		return Frame{}, fmt.Errorf("%w: length %d shorter than a header", ErrBadFrame, n)
	}
	if _, err := io.ReadFull(r, h[4:]); err != nil {
		if n > max {
			return Frame{}, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, max)
		}
		return Frame{}, unexpected(err)
	}
	if h[6] != 0 || h[7] != 0 {
		return Frame{}, fmt.Errorf("%w: reserved bytes set", ErrBadFrame)
	}
	f := Frame{Op: Op(h[4]), Flags: h[5], ID: binary.BigEndian.Uint64(h[8:])}
	if n > max {
		if !f.Op.Known() {
			return Frame{}, fmt.Errorf("%w: %d bytes, limit %d, of an unknown op", ErrFrameTooLarge, n, max)
		}
		return f, &LargeFrameError{Frame: f, Len: n, Max: max}
	}
	if p := n - (HeaderLen - 4); p > 0 {
		f.Payload = make([]byte, p)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			return Frame{}, unexpected(err)
		}
	}
	return f, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// opNames names every operation of this protocol version; it is also the
// list Known checks.
var opNames = map[Op]string{OpHello: "hello", OpPing: "ping", OpProduce: "produce", OpPull: "pull",
	OpHeartbeat: "heartbeat", OpGroupPull: "group-pull", OpCommit: "commit", OpRelease: "release",
	OpLeave: "leave", OpSendBack: "send-back", OpDeadLetter: "dead-letter", OpPop: "pop", OpAck: "ack",
	OpChangeInvis: "change-invisible", OpLag: "lag", OpReset: "reset", OpGroups: "groups",
	OpTopicCreate: "topic-create", OpTopicList: "topic-list", OpTopicGet: "topic-get", OpTopicDelete: "topic-delete", OpTopicResize: "topic-resize", OpGet: "get",
	OpFindByKey: "find-by-key", OpCancelDelay: "cancel-delayed", OpListDelayed: "list-delayed", OpTrace: "trace", OpQuery: "query",
	OpCheckTxn: "check-transaction", OpTxnHalf: "transaction-half", OpTxnEnd: "transaction-end",
	OpTxnRegister: "transaction-register", OpTxnList: "transaction-list", OpCluster: "cluster",
	OpCall:      "call",
	OpShadowGet: "shadow-get", OpShadowUpdate: "shadow-update", OpShadowDelete: "shadow-delete"}

// Known reports whether op is an operation of this protocol version.
func (op Op) Known() bool {
	_, ok := opNames[op]
	return ok
}

func (op Op) String() string {
	if s, ok := opNames[op]; ok {
		return s
	}
	return fmt.Sprintf("op(%#02x)", byte(op))
}
