package shadow

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Op is what an accepted change did.
type Op string

// The ops of events.
const (
	OpUpdate Op = "update"
	OpDelete Op = "delete"
)

// Event is one accepted change of a device's shadow: the body of the
// message on Topic (sharding key: the client ID, so one device's events
// are in one queue, in version order), and the record the store keeps as
// the device's latest. It carries the whole new document, so that a
// consumer needs no other read.
type Event struct {
	ClientID string `json:"client_id"`
	Op       Op     `json:"op"`
	// Section is the section an update changed ("" for a delete).
	Section Section `json:"section,omitempty"`
	// Version is the document's version after the change.
	Version int64 `json:"version"`
	// Timestamp is when it was accepted, in Unix milliseconds.
	Timestamp int64 `json:"timestamp"`
	// Shadow is the document after an update; nil after a delete.
	Shadow *Document `json:"shadow,omitempty"`
}

// deleted reports whether the event leaves the device without a shadow.
func (e *Event) deleted() bool { return e == nil || e.Shadow == nil }

// EncodeEvent is the JSON of e.
func EncodeEvent(e *Event) ([]byte, error) { return json.Marshal(e) }

// DecodeEvent decodes an event (a message body of Topic, a stored
// record) and checks it: a client ID, a known op, a version ≥ 1 that an
// update's document repeats, no document after a delete. Errors wrap
// ErrCorrupt.
func DecodeEvent(b []byte) (*Event, error) {
	var e Event
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("%w: event: %s", ErrCorrupt, jsonProblem(err))
	}
	if err := atEnd(dec); err != nil {
		return nil, fmt.Errorf("%w: event: data after the JSON value", ErrCorrupt)
	}
	if err := e.check(); err != nil {
		return nil, err
	}
	return &e, nil
}

// check says what is wrong with a decoded event (ErrCorrupt), if anything.
func (e *Event) check() error {
	switch {
	case e.ClientID == "":
		return fmt.Errorf("%w: event without a client ID", ErrCorrupt)
	case e.Version < 1:
		return fmt.Errorf("%w: event of %s: version %d", ErrCorrupt, e.ClientID, e.Version)
	case e.Op == OpUpdate && (e.Shadow == nil || e.Shadow.Version != e.Version):
		return fmt.Errorf("%w: update event of %s without its document of version %d", ErrCorrupt, e.ClientID, e.Version)
	case e.Op == OpDelete && e.Shadow != nil:
		return fmt.Errorf("%w: delete event of %s with a document", ErrCorrupt, e.ClientID)
	case e.Op != OpUpdate && e.Op != OpDelete:
		return fmt.Errorf("%w: event of %s: unknown op %q", ErrCorrupt, e.ClientID, e.Op)
	}
	return nil
}
