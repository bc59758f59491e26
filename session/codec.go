package session

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// Record values. Clients, subscriptions and retained messages are mochi's
// storage records (JSON). A queued (inflight) message is
//
//	0x01 | expiry, unix seconds, 8 bytes big-endian (0: never) | storage.Message JSON
//
// because mochi's record has no absolute expiry: with it a message keeps
// its deadline across restarts. A value starting with '{' is the older
// plain JSON (no expiry).
const msgVersion = 1

// errBadValue is returned for a record value that does not decode.
var errBadValue = errors.New("session: bad record value")

func encodeMsg(m *storage.Message, expiry int64) ([]byte, error) {
	js, err := m.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b := make([]byte, 9, 9+len(js))
	b[0] = msgVersion
	binary.BigEndian.PutUint64(b[1:], uint64(expiry))
	return append(b, js...), nil
}

func decodeMsg(v []byte) (m storage.Message, expiry int64, err error) {
	switch {
	case len(v) > 0 && v[0] == '{':
	case len(v) >= 9 && v[0] == msgVersion:
		expiry = int64(binary.BigEndian.Uint64(v[1:9]))
		v = v[9:]
	default:
		return m, 0, fmt.Errorf("%w: message record of %d bytes, version byte %#x", errBadValue, len(v), firstByte(v))
	}
	if expiry < 0 {
		return m, 0, fmt.Errorf("%w: negative expiry", errBadValue)
	}
	if err := m.UnmarshalBinary(v); err != nil {
		return m, 0, fmt.Errorf("%w: %w", errBadValue, err)
	}
	return m, expiry, nil
}

func firstByte(b []byte) byte {
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

func decodeMsgRef(v []byte) (msgRef, error) {
	m, expiry, err := decodeMsg(v)
	if err != nil {
		return msgRef{}, err
	}
	return msgRef{expiry: expiry, size: int32(len(m.Payload))}, nil
}

// toPacket is the message as mochi's inflight entry.
func toPacket(m *storage.Message, expiry int64) packets.Packet {
	pk := m.ToPacket()
	pk.Expiry = expiry
	return pk
}

func decodeSubRef(filter string, v []byte) (subRef, error) {
	var sub storage.Subscription
	if err := sub.UnmarshalBinary(v); err != nil {
		return subRef{}, fmt.Errorf("%w: %w", errBadValue, err)
	}
	if sub.Filter != filter || sub.Qos > 2 {
		return subRef{}, fmt.Errorf("%w: subscription %q qos %d under key %q", errBadValue, sub.Filter, sub.Qos, filter)
	}
	return newSubRef(packets.Subscription{Filter: sub.Filter, Qos: sub.Qos, Identifier: sub.Identifier,
		NoLocal: sub.NoLocal, RetainAsPublished: sub.RetainAsPublished, RetainHandling: sub.RetainHandling}), nil
}

func newSubRef(sub packets.Subscription) subRef {
	r := subRef{filter: sub.Filter, qos: sub.Qos, ident: int32(sub.Identifier), retain: sub.RetainHandling, slot: -1}
	if sub.NoLocal {
		r.flags |= subNoLocal
	}
	if sub.RetainAsPublished {
		r.flags |= subRetainAsPublished
	}
	if _, _, shared := mqtttopic.Unshare(sub.Filter); shared {
		r.flags |= subShared
	}
	return r
}

// subscription is r as mochi's subscription.
func (r *subRef) subscription() packets.Subscription {
	return packets.Subscription{Filter: r.filter, Qos: r.qos, Identifier: int(r.ident), RetainHandling: r.retain,
		NoLocal: r.flags&subNoLocal != 0, RetainAsPublished: r.flags&subRetainAsPublished != 0}
}

func subRecord(id string, sub packets.Subscription) *storage.Subscription {
	return &storage.Subscription{
		ID: subKey(id, sub.Filter), T: storage.SubscriptionKey, Client: id, Qos: sub.Qos, Filter: sub.Filter,
		Identifier: sub.Identifier, NoLocal: sub.NoLocal, RetainHandling: sub.RetainHandling,
		RetainAsPublished: sub.RetainAsPublished,
	}
}

func messageRecord(key, client string, pk packets.Packet, sent int64) *storage.Message {
	p := pk.Properties
	return &storage.Message{
		ID: key, Client: client, Origin: pk.Origin, FixedHeader: pk.FixedHeader, TopicName: pk.TopicName,
		Payload: pk.Payload, Sent: sent, Created: pk.Created, PacketID: pk.PacketID,
		Properties: storage.MessageProperties{
			PayloadFormat: p.PayloadFormat, PayloadFormatFlag: p.PayloadFormatFlag,
			MessageExpiryInterval: p.MessageExpiryInterval, ContentType: p.ContentType,
			ResponseTopic: p.ResponseTopic, CorrelationData: p.CorrelationData,
			SubscriptionIdentifier: p.SubscriptionIdentifier, User: p.User,
		},
	}
}
