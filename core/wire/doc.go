// Package wire is ferrymq's core protocol: how backend services talk to the
// core over TCP. It holds the frame codec, the binary encodings of messages
// and the operation codes; the server (core/server) and the Go client
// (core/client) both use it. docs/wire-protocol.md is the same
// specification written for someone implementing a client in another
// language.
//
// # Frames (all integers big-endian)
//
//	off  size  field
//	0    4     length N of the rest of the frame (12 + payload), 12 ≤ N ≤ max frame (default 8 MiB)
//	4    1     op code (Op)
//	5    1     flags: 0x01 response, 0x02 error, 0x04 push (server-initiated), 0x08 no reply wanted
//	6    2     reserved, 0
//	8    8     request ID: chosen by the requester, echoed in the response; 0 in pushes
//	16   N-12  payload
//
// A frame over the limit is refused from its header (LargeFrameError): a
// server skips its payload and answers the request with CodeFrameTooLarge,
// and the connection goes on.
//
// A connection starts with OpHello from the client (version, token, client
// ID); anything else first, a wrong version or a bad token gets an error
// frame and the connection is closed. After that requests may be pipelined:
// responses carry the request's ID and may come in any order (a long poll
// answers late without holding up anything else).
//
// Payloads of control operations are JSON objects (documented per op in
// docs/wire-protocol.md); payloads that carry messages (produce, pull, pop,
// get, find) use the binary encodings in message.go. An error response has
// flag 0x02 and a payload of u16 code (Code) + UTF-8 message.
//
// Decoders check every length before slicing and never panic; FuzzReadFrame
// and FuzzDecodeMessages cover them.
package wire
