package bridge

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// UplinkRule maps MQTT publishes whose topic matches Filter onto a core
// topic. Rules are tried in order; the first match wins.
type UplinkRule struct {
	// Filter is an MQTT topic filter ('+' and '#' wildcards).
	Filter string `yaml:"filter" json:"filter"`
	// Topic is the core topic, a template: "telemetry", "${level:1}".
	Topic string `yaml:"topic" json:"topic"`
	// Key is the sharding key template; "" means ${clientid}, which keeps
	// each device's messages in one queue, in publish order.
	Key string `yaml:"key" json:"key"`
	// Tag is an optional tag template (consumers filter on tags).
	Tag string `yaml:"tag" json:"tag"`
}

// DefaultUplinkRules is the bridge with no configuration: every non-'$'
// MQTT topic is bridged, its first level names the core topic and the
// client ID is the key.
func DefaultUplinkRules() []UplinkRule {
	return []UplinkRule{{Filter: "#", Topic: "${level:1}", Key: "${clientid}"}}
}

// Property names the uplink sets on every bridged message. MQTT 5 user
// properties travel under their own names; these win over a user property
// of the same name.
const (
	PropTopic         = "mqtt.topic"
	PropClientID      = "mqtt.clientid"
	PropUsername      = "mqtt.username"
	PropQoS           = "mqtt.qos"
	PropRetain        = "mqtt.retain"
	PropContentType   = "mqtt.content_type"
	PropResponseTopic = "mqtt.response_topic"
	PropCorrelation   = "mqtt.correlation_data"
	// PropDelay is the delay in seconds of a "$delayed/{seconds}/{topic}"
	// publish (mqtt.topic is {topic}).
	PropDelay = "mqtt.delay"
)

type uplinkRule struct {
	UplinkRule
	topic, key, tag template
	fixedTopic      bool // topic template has no variables: validated once
}

// Uplink turns MQTT publishes into core messages by its rules. It is
// immutable after NewUplink and safe for concurrent use.
type Uplink struct {
	rules []uplinkRule
}

// NewUplink compiles rules; nil means DefaultUplinkRules. Every problem is
// reported, joined.
func NewUplink(rules []UplinkRule) (*Uplink, error) {
	if rules == nil {
		rules = DefaultUplinkRules()
	}
	u := &Uplink{}
	var errs []error
	for i, r := range rules {
		cr, err := compileUplink(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("uplink rule %d: %w", i+1, err))
			continue
		}
		u.rules = append(u.rules, cr)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return u, nil
}

func compileUplink(r UplinkRule) (uplinkRule, error) {
	cr := uplinkRule{UplinkRule: r}
	if err := mqtttopic.ValidFilter(r.Filter); err != nil {
		return cr, fmt.Errorf("%w: %w", ErrBadRule, err)
	}
	if r.Topic == "" {
		return cr, fmt.Errorf("%w: filter %q has no core topic", ErrBadRule, r.Filter)
	}
	if r.Key == "" {
		cr.Key = "${clientid}"
	}
	var err error
	if cr.topic, err = parseTemplate(r.Topic); err != nil {
		return cr, err
	}
	if cr.key, err = parseTemplate(cr.Key); err != nil {
		return cr, err
	}
	if cr.tag, err = parseTemplate(r.Tag); err != nil {
		return cr, err
	}
	if cr.topic.constant() {
		if err := core.ValidateTopic(r.Topic); err != nil {
			return cr, fmt.Errorf("%w: %w", ErrBadRule, err)
		}
		cr.fixedTopic = true
	}
	return cr, nil
}

// Publish is what the uplink needs to know of an MQTT publish.
type Publish struct {
	Topic    string
	ClientID string
	Username string
	QoS      byte
	Retain   bool
	Payload  []byte
	// MQTT 5 only.
	User            []UserProperty
	ContentType     string
	ResponseTopic   string
	CorrelationData []byte
	// QoS2ID is the engine's ID of a QoS 2 publish (engine.Message.QoS2ID),
	// stored as PropQoS2ID; 0 for none.
	QoS2ID uint64
}

// UserProperty is one MQTT 5 user property.
type UserProperty struct{ Key, Value string }

// Map returns the core message for p, or ErrNoRule / ErrInvalidCoreTopic
// (wrapped) when p stays MQTT-only. The message's body aliases p.Payload.
func (u *Uplink) Map(p *Publish) (*core.Message, error) {
	m, _, err := u.MapRule(p)
	return m, err
}

// MapRule is Map that also returns the rule that matched p, its Key
// filled in if it was empty (the zero rule with ErrNoRule).
func (u *Uplink) MapRule(p *Publish) (*core.Message, UplinkRule, error) {
	for i := range u.rules {
		r := &u.rules[i]
		if !mqtttopic.Match(r.Filter, p.Topic) {
			continue
		}
		v := vars{clientID: p.ClientID, username: p.Username, topic: p.Topic}
		topic := r.topic.expand(&v)
		if !r.fixedTopic {
			if err := core.ValidateTopic(topic); err != nil {
				return nil, r.UplinkRule, fmt.Errorf("%w: %q from MQTT topic %q", ErrInvalidCoreTopic, topic, p.Topic)
			}
		}
		m := &core.Message{
			Topic:       topic,
			ShardingKey: r.key.expand(&v),
			Tag:         r.tag.expand(&v),
			Properties:  properties(p),
			Body:        p.Payload,
		}
		if m.ShardingKey != p.ClientID && p.ClientID != "" {
			// Indexed by the publishing client too, so that operators
			// find a device's messages by its client ID whatever the key.
			m.Keys = []string{p.ClientID}
		}
		return m, r.UplinkRule, nil
	}
	return nil, UplinkRule{}, ErrNoRule
}

func properties(p *Publish) map[string]string {
	props := make(map[string]string, 5+len(p.User))
	for _, up := range p.User {
		if up.Key != "" {
			props[up.Key] = up.Value // repeated names: the last one wins
		}
	}
	props[PropTopic] = p.Topic
	props[PropClientID] = p.ClientID
	if p.Username != "" {
		props[PropUsername] = p.Username
	}
	props[PropQoS] = strconv.Itoa(int(p.QoS))
	props[PropRetain] = strconv.FormatBool(p.Retain)
	if p.ContentType != "" {
		props[PropContentType] = p.ContentType
	}
	if p.ResponseTopic != "" {
		props[PropResponseTopic] = p.ResponseTopic
	}
	if len(p.CorrelationData) > 0 {
		props[PropCorrelation] = string(p.CorrelationData)
	}
	if p.QoS2ID != 0 {
		props[PropQoS2ID] = strconv.FormatUint(p.QoS2ID, 10)
	} else {
		delete(props, PropQoS2ID) // never a client's own
	}
	return props
}
