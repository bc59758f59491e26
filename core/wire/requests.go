package wire

import (
	"time"

	"github.com/ferrymq/ferrymq/core/delay"
)

// JSON payloads of the control operations. Field names are the protocol's;
// times are RFC 3339 strings, durations milliseconds.

// Hello opens a connection (OpHello).
type Hello struct {
	Version  int    `json:"version"`
	Token    string `json:"token,omitempty"`
	ClientID string `json:"client_id,omitempty"`
	// ProducerGroups are the transactional producer groups this client
	// produces for: check-backs of their half messages may be pushed to
	// this connection (as after OpTxnRegister).
	ProducerGroups []string `json:"producer_groups,omitempty"`
}

// HelloReply answers Hello.
type HelloReply struct {
	Version  int    `json:"version"`
	Server   string `json:"server"`
	MaxFrame int    `json:"max_frame"`
	// KeepaliveMS is how often the server expects to hear from the client
	// (any frame; OpPing when idle). Silence for three times as long closes
	// the connection.
	KeepaliveMS int64 `json:"keepalive_ms"`
}

// PullReq reads a queue without a group (OpPull).
type PullReq struct {
	Topic  string   `json:"topic"`
	Queue  int      `json:"queue"`
	Offset int64    `json:"offset"`
	Max    int      `json:"max,omitempty"`
	WaitMS int64    `json:"wait_ms,omitempty"`
	Tags   []string `json:"tags,omitempty"`
}

// Subscription is one topic of a heartbeat.
type Subscription struct {
	Topic string   `json:"topic"`
	Tags  []string `json:"tags,omitempty"`
}

// HeartbeatReq registers or refreshes a group member (OpHeartbeat).
type HeartbeatReq struct {
	Group         string         `json:"group"`
	ClientID      string         `json:"client_id"`
	Mode          string         `json:"mode,omitempty"`         // "clustering" (default) or "broadcast"
	From          string         `json:"from,omitempty"`         // "earliest" (default), "latest" or "timestamp"
	FromTimeMS    int64          `json:"from_time_ms,omitempty"` // "timestamp": where, unix milliseconds
	Subscriptions []Subscription `json:"subscriptions"`
}

// QueueRef names a queue.
type QueueRef struct {
	Topic string `json:"topic"`
	Queue int    `json:"queue"`
}

// Assignment answers a heartbeat.
type Assignment struct {
	Version uint64     `json:"version"`
	Queues  []QueueRef `json:"queues"`
}

// GroupPullReq pulls a queue for a group member (OpGroupPull). Offset -1
// starts from the group's committed offset.
//
// With Stream (and a wait), the request does not end with its first
// answer: the server sends the messages as they arrive, one answer per
// arrival, each starting where the one before ended and each but the last
// flagged FlagMore, until it has sent Max messages (Max answers at most,
// since a tag filter can move the offset without a message), an answer
// finds nothing within the wait, or an error ends it. It is one request's
// worth of messages, delivered without waiting for all of them: at one
// message per arrival a consumer sends one request per Max messages
// instead of one per message. A server that does not know the field
// answers once.
type GroupPullReq struct {
	Group    string `json:"group"`
	ClientID string `json:"client_id"`
	Topic    string `json:"topic"`
	Queue    int    `json:"queue"`
	Offset   int64  `json:"offset"`
	Max      int    `json:"max,omitempty"`
	WaitMS   int64  `json:"wait_ms,omitempty"`
	Stream   bool   `json:"stream,omitempty"`
}

// CommitReq commits a member's progress (OpCommit); also OpRelease (offset
// unused) and OpLeave (topic, queue, offset unused).
type CommitReq struct {
	Group    string `json:"group"`
	ClientID string `json:"client_id"`
	Topic    string `json:"topic,omitempty"`
	Queue    int    `json:"queue,omitempty"`
	Offset   int64  `json:"offset,omitempty"`
}

// SendBackReq asks for a message to be redelivered later (OpSendBack) or
// dead-lettered (OpDeadLetter, with its reconsume count).
type SendBackReq struct {
	Group     string `json:"group"`
	ID        string `json:"id"`
	Reason    string `json:"reason,omitempty"`
	Reconsume int    `json:"reconsume,omitempty"`
}

// SendBackReply says where a sent-back message went: "scheduled" or
// "dead-lettered".
type SendBackReply struct {
	Outcome string `json:"outcome"`
}

// PopReq pops messages (OpPop).
type PopReq struct {
	Group       string   `json:"group"`
	Topic       string   `json:"topic"`
	Max         int      `json:"max,omitempty"`
	InvisibleMS int64    `json:"invisible_ms,omitempty"`
	WaitMS      int64    `json:"wait_ms,omitempty"`
	Orderly     bool     `json:"orderly,omitempty"`
	Tags        []string `json:"tags,omitempty"`
}

// HandleReq acknowledges (OpAck) or changes the invisibility of
// (OpChangeInvis) a popped message.
type HandleReq struct {
	Handle      string `json:"handle"`
	InvisibleMS int64  `json:"invisible_ms,omitempty"`
}

// LagReq asks for a group's progress (OpLag).
type LagReq struct {
	Group  string `json:"group"`
	Member string `json:"member,omitempty"`
}

// QueueLag is one queue's progress.
type QueueLag struct {
	Topic        string    `json:"topic"`
	Queue        int       `json:"queue"`
	Committed    int64     `json:"committed"`
	Min          int64     `json:"min"`
	Max          int64     `json:"max"`
	Lag          int64     `json:"lag"`
	LastConsumed time.Time `json:"last_consumed,omitzero"`
	Owner        string    `json:"owner,omitempty"`
}

// ResetReq moves a group's offsets (OpReset): to Time if set, else to the
// latest if Latest, else to the earliest.
type ResetReq struct {
	Group  string    `json:"group"`
	Topic  string    `json:"topic"`
	Time   time.Time `json:"time,omitzero"`
	Latest bool      `json:"latest,omitempty"`
}

// ResetReply has the new offset of each queue.
type ResetReply struct {
	Offsets []int64 `json:"offsets"`
}

// GroupInfo describes a group with live members (OpGroups).
type GroupInfo struct {
	Group   string       `json:"group"`
	Mode    string       `json:"mode"`
	Members []MemberInfo `json:"members"`
}

// MemberInfo describes a live member.
type MemberInfo struct {
	ClientID      string     `json:"client_id"`
	LastHeartbeat time.Time  `json:"last_heartbeat"`
	Queues        []QueueRef `json:"queues"`
}

// TopicReq names a topic (OpTopicGet), creates one (OpTopicCreate) or
// changes its queue count (OpTopicResize).
type TopicReq struct {
	Name   string `json:"name"`
	Queues int    `json:"queues,omitempty"`
}

// TopicInfo describes a topic.
type TopicInfo struct {
	Name      string    `json:"name"`
	Queues    int       `json:"queues"`
	CreatedAt time.Time `json:"created_at"`
	// Ranges has one entry per readable queue: the Queues producers write
	// to, then those a resize retired that still hold messages.
	Ranges []QueueRange `json:"ranges"`
	// Epochs is the history of queue counts (core.Epoch), oldest first.
	Epochs []Epoch `json:"epochs,omitempty"`
}

// Epoch is one queue count of a topic and, after the first, the offset
// where it began in each queue.
type Epoch struct {
	Queues  int       `json:"queues"`
	Begin   []int64   `json:"begin,omitempty"`
	Started time.Time `json:"started,omitzero"`
}

// QueueRange is a queue's readable offsets [min, max) and how many
// messages they hold (offsets need not be dense: core.Broker.Backlog).
type QueueRange struct {
	Min      int64 `json:"min"`
	Max      int64 `json:"max"`
	Messages int64 `json:"messages"`
}

// FindReq finds messages by key (OpFindByKey).
type FindReq struct {
	Topic string    `json:"topic"`
	Key   string    `json:"key"`
	Max   int       `json:"max,omitempty"`
	Begin time.Time `json:"begin,omitzero"`
	End   time.Time `json:"end,omitzero"`
}

// DelayedReq names a delayed message (OpCancelDelay).
type DelayedReq struct {
	ID string `json:"id"`
}

// Delayed describes a delayed message not yet delivered.
type Delayed struct {
	ID    string    `json:"id"`
	Topic string    `json:"topic"`
	Due   time.Time `json:"due"`
	// Level is the level its newest copy waits in; Exit when it leaves it.
	Level     int       `json:"level"`
	Exit      time.Time `json:"exit"`
	Key       string    `json:"key,omitempty"`
	Tag       string    `json:"tag,omitempty"`
	Size      int       `json:"size"`
	Cancelled bool      `json:"cancelled,omitempty"`
}

// DelayedOf describes a pending delayed message, as the wire protocol and
// the HTTP API show it.
func DelayedOf(p delay.Pending) Delayed {
	out := Delayed{ID: p.ID.String(), Topic: p.Topic, Due: p.Due.UTC(), Level: p.Level, Exit: p.Exit.UTC(), Cancelled: p.Cancelled}
	if p.Copy != nil {
		out.Key = p.Copy.Properties[delay.PropShardingKey]
		out.Tag = p.Copy.Tag
		out.Size = len(p.Copy.Body)
	}
	return out
}

// ListDelayedReq pages through pending delayed messages (OpListDelayed).
type ListDelayedReq struct {
	Topic  string `json:"topic,omitempty"`
	Level  int    `json:"level,omitempty"`
	Offset int64  `json:"offset,omitempty"`
	Max    int    `json:"max,omitempty"`
}

// ListDelayedReply is one page; continue from NextLevel/NextOffset unless Done.
type ListDelayedReply struct {
	Pending    []Delayed `json:"pending"`
	NextLevel  int       `json:"next_level"`
	NextOffset int64     `json:"next_offset"`
	Done       bool      `json:"done"`
}

// Transaction actions of TxnEndReq.
const (
	TxnCommit   = "commit"
	TxnRollback = "rollback"
	TxnUnknown  = "unknown"
)

// TxnEndReq resolves a half message (OpTxnEnd). FromCheck is set when it
// answers a check-back.
type TxnEndReq struct {
	ID        string `json:"id"`
	Group     string `json:"group"`
	Action    string `json:"action"`
	FromCheck bool   `json:"from_check,omitempty"`
}

// TxnRegisterReq announces the transactional producer groups a connection
// serves check-backs for (OpTxnRegister): the whole set, replacing the one
// announced before (an empty list withdraws them all).
type TxnRegisterReq struct {
	Groups []string `json:"groups"`
}

// TxnPending describes an unresolved half message (OpTxnList).
type TxnPending struct {
	ID        string    `json:"id"`
	Group     string    `json:"group"`
	Topic     string    `json:"topic"`
	StoredAt  time.Time `json:"stored_at"`
	Checks    int       `json:"checks"`
	NextCheck time.Time `json:"next_check"`
}

// TraceReq asks for a message's trace (OpTrace).
type TraceReq struct {
	ID  string `json:"id"`
	Max int    `json:"max,omitempty"`
}

// QueryReq finds messages (OpQuery): by key, by MQTT client, or by store
// time within a topic; Begin/End bound every kind.
type QueryReq struct {
	Topic    string    `json:"topic,omitempty"`
	Key      string    `json:"key,omitempty"`
	ClientID string    `json:"client,omitempty"`
	Begin    time.Time `json:"begin,omitzero"`
	End      time.Time `json:"end,omitzero"`
	Max      int       `json:"max,omitempty"`
	Cursor   string    `json:"cursor,omitempty"`
}

// ClusterInfo is the answer to OpCluster: the nodes a client may connect
// to, so that it needs one address to learn them all.
type ClusterInfo struct {
	Nodes []NodeInfo `json:"nodes"`
	// Groups names, per consumer group, the node serving it now (the
	// groups a node serves; absent on a lone server, which serves them
	// all). A client sends a group's requests there; a node asked for a
	// group it does not serve answers CodeMoved naming it.
	Groups map[string]string `json:"groups,omitempty"`
}

// Addrs are the core addresses the nodes have (those not yet known left
// out), in order.
func (c ClusterInfo) Addrs() []string {
	var out []string
	for _, n := range c.Nodes {
		if n.Core != "" {
			out = append(out, n.Core)
		}
	}
	return out
}

// NodeInfo is one node of a ClusterInfo.
type NodeInfo struct {
	// Name is the node's name ("" for a lone server that has none).
	Name string `json:"name,omitempty"`
	// Core is the address its core port is reached at, host:port ("" when
	// it has not listened yet and none is configured).
	Core string `json:"core,omitempty"`
	// Holder: it holds the core services (consumer groups, POP, retry,
	// transactions) now.
	Holder bool `json:"holder,omitempty"`
}

// CallReq is a synchronous call to a device (OpCall).
type CallReq struct {
	ClientID string `json:"client_id"`
	Payload  []byte `json:"payload"`
	// TimeoutMS is how long to wait for the device's answer, 1,000–60,000;
	// 0 means the server's default (5 s).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// CallResp is a device's answer to a call.
type CallResp struct {
	// ID is the call's ID: its trace is recorded under it.
	ID      string `json:"id"`
	Payload []byte `json:"payload"`
	// Node is the gateway node the device is connected to.
	Node string `json:"node,omitempty"`
	// TookMS is the time from the call reaching the server to the answer.
	TookMS float64 `json:"took_ms"`
}
