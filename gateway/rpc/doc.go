// Package rpc makes synchronous calls to devices (RRPC): a backend sends a
// request to one connected MQTT client and waits for its answer, as
// Alibaba's RRPC or Azure's direct methods do.
//
// # Topics
//
// A call gets an ID (a core.MessageID of kind IDKindCall, printed as 32
// hex characters) and reaches the device as a QoS 1 PUBLISH, point to point
// (the device need not subscribe), that expires with the call:
//
//	request   $rpc/{client}/request/{id}    payload: the call's
//	response  $rpc/{client}/response/{id}   payload: the device's answer
//
// An MQTT 5 device gets the request with Response Topic (the response
// topic above) and Correlation Data (the ID's 32 characters) and answers
// on that topic; an MQTT 3.1.1 device answers on the response topic it
// builds from the request topic by the convention above. Answers are taken
// off the bridge (Service is a bridge.Interceptor for "$rpc/"): never
// stored, never delivered to subscribers. A device may answer only its own
// calls; a publish to another client's "$rpc/" topic or to a request topic
// is refused (0x87). An answer that comes after its call ended is
// acknowledged and counted (ferrymq_rpc_answers_unmatched_total).
//
// # Outcomes
//
// Call fails at once with ErrNotConnected when no node has the device
// connected, with ErrTimeout when it does not answer within the call's
// timeout (1–60 s). A device that disconnects during a call makes it time
// out: its request expires with the call, so it never arrives late.
//
// # Between nodes (engine nats)
//
// With Options.Conn, a call for a device not connected here is asked of
// the other nodes: one NATS message on {prefix}.call, which every node
// subscribes to. The node that has the device connected answers "here" at
// once, delivers the request, and later sends the device's answer (or
// "timeout") to the calling node's reply subject {prefix}.reply.{node};
// the others answer "absent". The calling node fails the call as not
// connected once every other live node (Options.Peers) said absent, or when
// none said here within AskWindow. No table of devices is kept anywhere:
// the connection is the registry.
//
//	headers   Fmq-Rpc-V       "1"
//	          Fmq-Rpc-Id      the call's ID (hex)
//	          Fmq-Rpc-Client  the device's client ID (URL query-escaped)
//	          Fmq-Rpc-Timeout milliseconds left (call only)
//	          Fmq-Rpc-State   here | absent | answer | timeout | error (replies)
//	data      the request (call) or the answer (answer)
//
// # Tracing
//
// When tracing covers every topic, or the name TraceTopic, each call's hops
// are recorded under its ID: rpc.call (the node the call came through),
// rpc.request (the request handed to the device's connection), rpc.answer
// (the device's answer), or rpc.timeout.
package rpc
