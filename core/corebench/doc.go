// Package corebench generates load on a ferrymq core server over the core
// TCP protocol (the Go client), for `ferrymq bench` subcommands that measure
// the core rather than MQTT (gateway/mqttbench does that).
//
// RunTail measures how well consumers at the tail of a topic are isolated
// from a consumer that replays a backlog (issue #21). It runs, in one
// process and sharing one clock with the server on the same machine:
//
//   - producers that send Rate messages a second of Size bytes to Topic,
//     paced evenly (at most 256 unacknowledged per producer; a producer
//     that falls behind sends what is due as soon as it can);
//   - a tail group, a clustering push consumer of Topic that starts at its
//     end, recording for each message the time from its store time
//     (core.StoredMessage.StoredAt, set by the server) to its receipt;
//   - with BacklogTopic set, a backlog group: a new group consuming
//     BacklogTopic from its earliest message, counting messages and bytes.
//
// After Warmup the measured window opens — once the backlog group has
// received its first message, when there is one — and closes after
// Duration, or earlier when the backlog group has consumed the whole
// backlog (what BacklogTopic held when the run started). Only tail
// messages received inside the window count toward the latencies, and the
// backlog's rate is its bytes over the window.
//
// RunTail owns every goroutine and connection it starts and returns only
// after all have ended. It leaves its groups behind on the server (their
// names start with "tailbench-").
package corebench
