package session

import (
	"bytes"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// ID implements mqtt.Hook.
func (s *Store) ID() string { return "ferrymq-session" }

// Provides implements mqtt.Hook.
func (s *Store) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnSessionEstablish, mqtt.OnSessionEstablished, mqtt.OnDisconnect, mqtt.OnSubscribed, mqtt.OnUnsubscribed,
		mqtt.OnRetainMessage, mqtt.OnRetainedExpired, mqtt.OnWillSent, mqtt.OnClientExpired,
		mqtt.OnQosPublish, mqtt.OnQosComplete, mqtt.OnQosDropped,
		mqtt.StoredClients, mqtt.StoredSubscriptions, mqtt.StoredInflightMessages, mqtt.StoredRetainedMessages,
	}, []byte{b})
}

// Stop implements mqtt.Hook: mochi calls it when the server closes.
func (s *Store) Stop() error { return s.Close() }

// persistent reports whether cl's session outlives its connection: MQTT 5
// with a session expiry, MQTT 3 without clean session [MQTT-3.1.2-4]. Only
// those are stored; a clean session costs the store nothing.
func persistent(cl *mqtt.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryInterval > 0
	}
	return !cl.Properties.Clean
}

func (s *Store) putClient(cl *mqtt.Client) {
	p := cl.Properties.Props
	s.put(clientKey(cl.ID), &storage.Client{
		ID: cl.ID, T: storage.ClientKey, Remote: cl.Net.Remote, Listener: cl.Net.Listener,
		Username: cl.Properties.Username, Clean: cl.Properties.Clean, ProtocolVersion: cl.Properties.ProtocolVersion,
		Properties: storage.ClientProperties{
			SessionExpiryInterval: p.SessionExpiryInterval, SessionExpiryIntervalFlag: p.SessionExpiryIntervalFlag,
			AuthenticationMethod: p.AuthenticationMethod, AuthenticationData: p.AuthenticationData,
			RequestProblemInfo: p.RequestProblemInfo, RequestProblemInfoFlag: p.RequestProblemInfoFlag,
			RequestResponseInfo: p.RequestResponseInfo, ReceiveMaximum: p.ReceiveMaximum,
			TopicAliasMaximum: p.TopicAliasMaximum, User: p.User, MaximumPacketSize: p.MaximumPacketSize,
		},
		Will: storage.ClientWill(cl.Properties.Will),
	})
}

// OnSessionEstablish stores a persistent client before its CONNACK is
// sent, so a session the client was told about survives a crash right
// after; a clean one drops whatever an earlier persistent session of that
// ID left.
func (s *Store) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	if !persistent(cl) {
		s.delClient(cl.ID)
		return
	}
	s.putClient(cl)
}

// OnSessionEstablished stores the subscriptions a resumed session brought.
func (s *Store) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	if !persistent(cl) {
		return
	}
	for _, sub := range cl.State.Subscriptions.GetAll() {
		s.putSub(cl.ID, sub)
	}
}

// OnWillSent stores the client with its will spent (mochi clears the will
// flag before this hook runs), so a restart does not send it again.
func (s *Store) OnWillSent(cl *mqtt.Client, _ packets.Packet) {
	if persistent(cl) {
		s.putClient(cl)
	}
}

// OnDisconnect forgets a session that ends with its connection.
func (s *Store) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if expire && !cl.IsTakenOver() {
		s.delClient(cl.ID)
	}
}

// OnClientExpired forgets a session whose expiry passed.
func (s *Store) OnClientExpired(cl *mqtt.Client) { s.delClient(cl.ID) }

func (s *Store) putSub(id string, sub packets.Subscription) {
	s.put(subKey(id, sub.Filter), &storage.Subscription{
		ID: subKey(id, sub.Filter), T: storage.SubscriptionKey, Client: id, Qos: sub.Qos, Filter: sub.Filter,
		Identifier: sub.Identifier, NoLocal: sub.NoLocal, RetainHandling: sub.RetainHandling,
		RetainAsPublished: sub.RetainAsPublished,
	})
}

// OnSubscribed stores a persistent client's granted subscriptions.
func (s *Store) OnSubscribed(cl *mqtt.Client, pk packets.Packet, codes []byte) {
	if !persistent(cl) {
		return
	}
	for i, f := range pk.Filters {
		if i < len(codes) && codes[i] <= 2 {
			f.Qos = codes[i]
			s.putSub(cl.ID, f)
		}
	}
}

// OnUnsubscribed forgets subscriptions.
func (s *Store) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	for _, f := range pk.Filters {
		s.del(subKey(cl.ID, f.Filter))
	}
}

func message(key, client string, pk packets.Packet, sent int64) *storage.Message {
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

// OnQosPublish stores an outbound QoS 1/2 message of a persistent session
// until the client acknowledges it: after a restart mochi resends it (DUP).
func (s *Store) OnQosPublish(cl *mqtt.Client, pk packets.Packet, sent int64, _ int) {
	if !persistent(cl) || pk.FixedHeader.Type != packets.Publish {
		return
	}
	k := inflightKey(cl.ID, pk.PacketID)
	m := message(k, cl.ID, pk, sent)
	m.T = storage.InflightKey
	s.put(k, m)
}

// OnQosComplete forgets an acknowledged message.
func (s *Store) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	s.del(inflightKey(cl.ID, pk.PacketID))
}

// OnQosDropped forgets a message mochi gave up on.
func (s *Store) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	s.del(inflightKey(cl.ID, pk.PacketID))
}

// OnRetainMessage stores (or, r == -1, forgets) a retained message.
func (s *Store) OnRetainMessage(cl *mqtt.Client, pk packets.Packet, r int64) {
	k := retainedKey(pk.TopicName)
	if r == -1 {
		s.del(k)
		return
	}
	m := message(k, cl.ID, pk, 0)
	m.T = storage.RetainedKey
	s.put(k, m)
}

// OnRetainedExpired forgets an expired retained message.
func (s *Store) OnRetainedExpired(topic string) { s.del(retainedKey(topic)) }

// StoredClients returns the sessions loaded at Open.
func (s *Store) StoredClients() ([]storage.Client, error) {
	return decodeAll[storage.Client](s, kClient)
}

// StoredSubscriptions returns the subscriptions loaded at Open.
func (s *Store) StoredSubscriptions() ([]storage.Subscription, error) {
	return decodeAll[storage.Subscription](s, kSub)
}

// StoredInflightMessages returns the inflight messages loaded at Open.
func (s *Store) StoredInflightMessages() ([]storage.Message, error) {
	return decodeAll[storage.Message](s, kInflight)
}

// StoredRetainedMessages returns the retained messages loaded at Open.
func (s *Store) StoredRetainedMessages() ([]storage.Message, error) {
	return decodeAll[storage.Message](s, kRetained)
}

// decodeAll decodes the values loaded under prefix; one that does not
// decode is dropped with a log line (its session is lost, no other).
func decodeAll[T any, PT interface {
	*T
	UnmarshalBinary([]byte) error
}](s *Store, prefix string) ([]T, error) {
	var out []T
	for _, b := range s.loadedWith(prefix) {
		var v T
		if err := PT(&v).UnmarshalBinary(b); err != nil {
			s.log.Warn().Err(err).Str("kind", prefix).Msg("session record does not decode; dropped")
			continue
		}
		out = append(out, v)
	}
	return out, nil
}
