package cluster

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// The headers of a routed message (doc.go has the table). Their names and
// encodings are part of the format between nodes: a node refuses a message
// whose hdrVersion it does not know. Strings that may hold anything (node
// and client IDs, MQTT 5 strings, user properties) are URL query-escaped,
// so no value carries a CR or LF.
const (
	hdrVersion       = "Fmq-V"
	hdrOrigin        = "Fmq-Origin"
	hdrID            = "Fmq-Id"
	hdrClient        = "Fmq-Client"
	hdrQoS           = "Fmq-Qos"
	hdrRetain        = "Fmq-Retain"
	hdrExpiry        = "Fmq-Expiry"
	hdrFormat        = "Fmq-Payload-Format"
	hdrContentType   = "Fmq-Content-Type"
	hdrResponseTopic = "Fmq-Response-Topic"
	hdrCorrelation   = "Fmq-Correlation-Data"
	hdrUser          = "Fmq-User"
	hdrServed        = "Fmq-Served"

	wireVersion = "1"
)

// message is one MQTT publish as it travels between nodes, less its topic
// (the subject) and payload (the data).
type message struct {
	origin string // the node it was published on
	id     uint64 // unique among the origin's messages
	client string // the publishing client (its packet origin)
	qos    byte
	retain bool
	expiry uint32 // message expiry interval left, seconds; 0: none
	format byte   // payload format indicator, when formatSet
	// formatSet: the publish carried a payload format indicator.
	formatSet     bool
	contentType   string
	responseTopic string
	correlation   []byte
	user          []engine.UserProperty
	// served are the queue groups of the shared subscriptions the origin
	// delivered the message to itself: no other node delivers it to them.
	served []string
}

func escape(s string) string { return url.QueryEscape(s) }

func (m *message) header() nats.Header {
	h := nats.Header{
		hdrVersion: {wireVersion},
		hdrOrigin:  {escape(m.origin)},
		hdrID:      {strconv.FormatUint(m.id, 10)},
		hdrQoS:     {strconv.Itoa(int(m.qos))},
	}
	if m.client != "" {
		h[hdrClient] = []string{escape(m.client)}
	}
	if m.retain {
		h[hdrRetain] = []string{"1"}
	}
	if m.expiry > 0 {
		h[hdrExpiry] = []string{strconv.FormatUint(uint64(m.expiry), 10)}
	}
	if m.formatSet {
		h[hdrFormat] = []string{strconv.Itoa(int(m.format))}
	}
	if m.contentType != "" {
		h[hdrContentType] = []string{escape(m.contentType)}
	}
	if m.responseTopic != "" {
		h[hdrResponseTopic] = []string{escape(m.responseTopic)}
	}
	if len(m.correlation) > 0 {
		h[hdrCorrelation] = []string{base64.StdEncoding.EncodeToString(m.correlation)}
	}
	for _, u := range m.user {
		h[hdrUser] = append(h[hdrUser], escape(u.Key)+"="+escape(u.Value))
	}
	if len(m.served) > 0 {
		h[hdrServed] = m.served
	}
	return h
}

// decodeMessage reads the headers of a routed message. It never panics;
// any value it cannot read is an error (the message is dropped).
func decodeMessage(h nats.Header) (message, error) {
	var m message
	var err error
	one := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	str := func(k string) string {
		if err != nil {
			return ""
		}
		s, e := url.QueryUnescape(one(k))
		if e != nil {
			err = fmt.Errorf("header %s: %w", k, e)
		}
		return s
	}
	num := func(k string, bits int) uint64 {
		v := one(k)
		if err != nil || v == "" {
			return 0
		}
		n, e := strconv.ParseUint(v, 10, bits)
		if e != nil {
			err = fmt.Errorf("header %s: %w", k, e)
		}
		return n
	}
	if v := one(hdrVersion); v != wireVersion {
		return m, fmt.Errorf("%w: version %q", ErrBadMessage, v)
	}
	m.origin = str(hdrOrigin)
	if one(hdrID) == "" || m.origin == "" {
		return m, fmt.Errorf("%w: no origin", ErrBadMessage)
	}
	m.id = num(hdrID, 64)
	m.client = str(hdrClient)
	m.qos = byte(num(hdrQoS, 8))
	if m.qos > 2 {
		return m, fmt.Errorf("%w: qos %d", ErrBadMessage, m.qos)
	}
	m.retain = one(hdrRetain) == "1"
	m.expiry = uint32(num(hdrExpiry, 32))
	if one(hdrFormat) != "" {
		m.format, m.formatSet = byte(num(hdrFormat, 8)), true
	}
	m.contentType = str(hdrContentType)
	m.responseTopic = str(hdrResponseTopic)
	if v := one(hdrCorrelation); v != "" && err == nil {
		if m.correlation, err = base64.StdEncoding.DecodeString(v); err != nil {
			err = fmt.Errorf("header %s: %w", hdrCorrelation, err)
		}
	}
	for _, kv := range h[hdrUser] {
		if err != nil {
			break
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			err = fmt.Errorf("header %s: no '='", hdrUser)
			break
		}
		var u engine.UserProperty
		if u.Key, err = url.QueryUnescape(k); err == nil {
			u.Value, err = url.QueryUnescape(v)
		}
		m.user = append(m.user, u)
	}
	m.served = h[hdrServed]
	if err != nil {
		return m, fmt.Errorf("%w: %w", ErrBadMessage, err)
	}
	return m, nil
}

// engineMessage is the message to deliver here for m on topic with
// payload, received at now.
func (m *message) engineMessage(topic string, payload []byte, now time.Time) *engine.Message {
	em := &engine.Message{Topic: topic, Payload: payload, QoS: m.qos, Retain: m.retain, Origin: m.client, Created: now.UnixNano()}
	if m.expiry > 0 {
		em.Expiry = now.Unix() + int64(m.expiry)
	}
	if m.formatSet || m.contentType != "" || m.responseTopic != "" || len(m.correlation) > 0 || len(m.user) > 0 {
		em.Props = &engine.Props{PayloadFormat: m.format, PayloadFormatSet: m.formatSet, ContentType: m.contentType,
			ResponseTopic: m.responseTopic, CorrelationData: m.correlation, User: m.user}
	}
	return em
}
