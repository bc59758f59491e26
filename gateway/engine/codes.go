package engine

import "fmt"

// ReasonCode is an MQTT 5 reason code (§2.4). MQTT 3 clients see the CONNACK
// return codes they know instead (v3Connack).
type ReasonCode byte

// The reason codes the engine uses.
const (
	Success                     ReasonCode = 0x00
	GrantedQoS1                 ReasonCode = 0x01
	GrantedQoS2                 ReasonCode = 0x02
	DisconnectWithWill          ReasonCode = 0x04
	NoMatchingSubscribers       ReasonCode = 0x10
	NoSubscriptionExisted       ReasonCode = 0x11
	UnspecifiedError            ReasonCode = 0x80
	MalformedPacket             ReasonCode = 0x81
	ProtocolError               ReasonCode = 0x82
	ImplementationSpecific      ReasonCode = 0x83
	UnsupportedProtocol         ReasonCode = 0x84
	ClientIDNotValid            ReasonCode = 0x85
	BadUsernameOrPassword       ReasonCode = 0x86
	NotAuthorized               ReasonCode = 0x87
	ServerUnavailable           ReasonCode = 0x88
	ServerBusy                  ReasonCode = 0x89
	Banned                      ReasonCode = 0x8A
	ServerShuttingDown          ReasonCode = 0x8B
	BadAuthenticationMethod     ReasonCode = 0x8C
	KeepAliveTimeout            ReasonCode = 0x8D
	SessionTakenOver            ReasonCode = 0x8E
	TopicFilterInvalid          ReasonCode = 0x8F
	TopicNameInvalid            ReasonCode = 0x90
	PacketIDInUse               ReasonCode = 0x91
	PacketIDNotFound            ReasonCode = 0x92
	ReceiveMaximumExceeded      ReasonCode = 0x93
	TopicAliasInvalid           ReasonCode = 0x94
	PacketTooLarge              ReasonCode = 0x95
	MessageRateTooHigh          ReasonCode = 0x96
	QuotaExceeded               ReasonCode = 0x97
	AdministrativeAction        ReasonCode = 0x98
	PayloadFormatInvalid        ReasonCode = 0x99
	RetainNotSupported          ReasonCode = 0x9A
	QoSNotSupported             ReasonCode = 0x9B
	SharedSubNotSupported       ReasonCode = 0x9E
	ConnectionRateExceeded      ReasonCode = 0x9F
	MaximumConnectTime          ReasonCode = 0xA0
	SubscriptionIDsNotSupported ReasonCode = 0xA1
	WildcardSubsNotSupported    ReasonCode = 0xA2
)

var codeNames = map[ReasonCode]string{
	Success: "success", GrantedQoS1: "granted qos 1", GrantedQoS2: "granted qos 2",
	DisconnectWithWill: "disconnect with will message", NoMatchingSubscribers: "no matching subscribers",
	NoSubscriptionExisted: "no subscription existed", UnspecifiedError: "unspecified error",
	MalformedPacket: "malformed packet", ProtocolError: "protocol error",
	ImplementationSpecific: "implementation specific error", UnsupportedProtocol: "unsupported protocol version",
	ClientIDNotValid: "client identifier not valid", BadUsernameOrPassword: "bad user name or password",
	NotAuthorized: "not authorized", ServerUnavailable: "server unavailable", ServerBusy: "server busy",
	Banned: "banned", ServerShuttingDown: "server shutting down", BadAuthenticationMethod: "bad authentication method",
	KeepAliveTimeout: "keep alive timeout", SessionTakenOver: "session taken over",
	TopicFilterInvalid: "topic filter invalid", TopicNameInvalid: "topic name invalid",
	PacketIDInUse: "packet identifier in use", PacketIDNotFound: "packet identifier not found",
	ReceiveMaximumExceeded: "receive maximum exceeded", TopicAliasInvalid: "topic alias invalid",
	PacketTooLarge: "packet too large", MessageRateTooHigh: "message rate too high", QuotaExceeded: "quota exceeded",
	AdministrativeAction: "administrative action", PayloadFormatInvalid: "payload format invalid",
	RetainNotSupported: "retain not supported", QoSNotSupported: "qos not supported",
	SharedSubNotSupported: "shared subscriptions not supported", ConnectionRateExceeded: "connection rate exceeded",
	MaximumConnectTime: "maximum connect time", SubscriptionIDsNotSupported: "subscription identifiers not supported",
	WildcardSubsNotSupported: "wildcard subscriptions not supported",
}

func (c ReasonCode) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("reason code %#02x", byte(c))
}

// v3Connack maps a refusal to the CONNACK return codes of MQTT 3.1 and
// 3.1.1 (§3.2.2.3): 1 unacceptable protocol version, 2 identifier
// rejected, 3 server unavailable, 4 bad user name or password, 5 not
// authorized.
func v3Connack(c ReasonCode) byte {
	switch c {
	case Success:
		return 0
	case UnsupportedProtocol:
		return 1
	case ClientIDNotValid:
		return 2
	case BadUsernameOrPassword, BadAuthenticationMethod:
		return 4
	case NotAuthorized, Banned:
		return 5
	default:
		return 3
	}
}

// protocolError is a violation that ends the connection: code says which
// (MQTT 5 clients past their CONNACK are told with DISCONNECT), spec the
// rule's tag.
type protocolError struct {
	code ReasonCode
	spec string
	msg  string
}

func (e *protocolError) Error() string {
	if e.spec != "" {
		return fmt.Sprintf("%s: %s %s", e.code, e.msg, e.spec)
	}
	return fmt.Sprintf("%s: %s", e.code, e.msg)
}

func malformed(spec, format string, args ...any) *protocolError {
	return &protocolError{code: MalformedPacket, spec: spec, msg: fmt.Sprintf(format, args...)}
}

func violation(spec, format string, args ...any) *protocolError {
	return &protocolError{code: ProtocolError, spec: spec, msg: fmt.Sprintf(format, args...)}
}
