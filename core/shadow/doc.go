// Package shadow keeps device shadows: per device (MQTT client ID) a JSON
// document with the state a backend wants the device in (desired), the
// state the device reports (reported), the fields of desired that differ
// from reported (delta), per-field update times (metadata) and a version.
//
// Updates are JSON merge patches (RFC 7386) on one section: null removes a
// field, objects merge, anything else replaces. Every accepted change —
// an update or a delete — raises the version by one; an update or delete
// that names a version (not 0) is accepted only while the document is at
// that version (ErrVersionConflict otherwise: optimistic concurrency).
// Limits: a document's two sections as JSON at most Limits.MaxBytes
// (default 8 KiB, ErrTooLarge), objects and arrays nested at most
// Limits.MaxDepth (default 6, ErrBadRequest).
//
// Every accepted change is an Event on the core topic Options.Topic
// ("device-shadows"), sharding key the client ID, carrying the whole new
// document: backends consume the history like any topic.
//
// Two backends keep the latest documents:
//
//   - OpenLog, for the embedded engine: the topic is the record. A change
//     is accepted once its event is stored (under the store's flush policy:
//     with "sync", fsynced), with one device's changes produced one at a
//     time, so the topic holds them in version order. The latest event per
//     device is kept in memory, rebuilt at Open from a snapshot file
//     (snapshot.go: written atomically and fsynced every
//     LogOptions.SnapshotInterval and at Close, with the queue offsets it
//     covers) and the events after it. A kill -9 loses nothing accepted:
//     the next Open reads the events the snapshot does not hold. Events
//     retention deletes before a snapshot covered them are lost (a warning
//     says so); with the default 72 h retention and 1 min snapshots that
//     takes a disk-full cut of the topic.
//   - package bucket, for the JetStream engine: a key-value bucket
//     ("ferrymq_shadows") shared by the gateway nodes, the key's revision
//     being the optimistic lock across nodes. A change is accepted once
//     the bucket stored it, marked as not yet in the topic; its event is
//     produced and the record marked. A change on top of an unmarked
//     record produces that record's event first, and the watchers repair
//     records left unmarked: no accepted change is missing from the topic,
//     and versions first appear in order, but an event may be repeated
//     (package bucket).
//
// Open takes any Backend. The package imports nothing of NATS nor of
// Prometheus: the core wire protocol and the Go client use its documents,
// decoders and errors (Service.Requests has the counts the node exports).
//
// A Service is safe for concurrent use; Close waits for the requests in
// flight and closes its backend, which stops the goroutines it started
// (the snapshot loop, the bucket watcher).
package shadow
