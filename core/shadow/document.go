package shadow

import (
	"encoding/json"
	"strconv"
)

// Section names one half of a document.
type Section string

// The sections of a document.
const (
	// Desired is the state a backend wants the device in.
	Desired Section = "desired"
	// Reported is the state the device says it is in.
	Reported Section = "reported"
)

// Document is a device's shadow as every surface shows it (MQTT answers,
// the wire protocol, HTTP, events on Topic).
type Document struct {
	State    State    `json:"state"`
	Metadata Metadata `json:"metadata"`
	// Version is 1 for the first accepted change and grows by one with
	// each accepted change after it, deletes included: a shadow created
	// again after a delete goes on from there.
	Version int64 `json:"version"`
	// Timestamp is when the last change was accepted, in Unix
	// milliseconds.
	Timestamp int64 `json:"timestamp"`
}

// State holds the two sections and what differs between them.
type State struct {
	Desired  map[string]any `json:"desired,omitempty"`
	Reported map[string]any `json:"reported,omitempty"`
	// Delta are the fields of Desired (recursively) whose value Reported
	// does not have; computed, never written by a request.
	Delta map[string]any `json:"delta,omitempty"`
}

// Metadata mirrors the sections' structure: where a section has an
// object, Metadata has an object of the same fields; where it has any
// other value, {"timestamp": ms} — when that field was last set.
type Metadata struct {
	Desired  map[string]any `json:"desired,omitempty"`
	Reported map[string]any `json:"reported,omitempty"`
}

// timestampField is a metadata leaf's one field.
const timestampField = "timestamp"

// section returns the section's state and metadata.
func (d *Document) section(s Section) (state, meta map[string]any) {
	if s == Desired {
		return d.State.Desired, d.Metadata.Desired
	}
	return d.State.Reported, d.Metadata.Reported
}

func (d *Document) setSection(s Section, state, meta map[string]any) {
	if len(state) == 0 {
		state, meta = nil, nil
	}
	if s == Desired {
		d.State.Desired, d.Metadata.Desired = state, meta
		return
	}
	d.State.Reported, d.Metadata.Reported = state, meta
}

// clone returns a deep copy of d: stored documents are never changed in
// place, since readers hold them.
func (d *Document) clone() *Document {
	if d == nil {
		return nil
	}
	c := *d
	c.State = State{Desired: cloneObject(d.State.Desired), Reported: cloneObject(d.State.Reported), Delta: cloneObject(d.State.Delta)}
	c.Metadata = Metadata{Desired: cloneObject(d.Metadata.Desired), Reported: cloneObject(d.Metadata.Reported)}
	return &c
}

func cloneObject(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = cloneValue(v)
	}
	return c
}

func cloneValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		return cloneObject(v)
	case []any:
		c := make([]any, len(v))
		for i, e := range v {
			c[i] = cloneValue(e)
		}
		return c
	default:
		return v // strings, json.Number, bool: immutable
	}
}

// merge applies patch to state (and meta) as a JSON merge patch (RFC
// 7386): a null removes the field, an object merges into an object (and
// replaces anything else), every other value replaces the field; each
// field set gets its metadata timestamp now. state and meta are changed
// in place (callers pass copies) and returned.
func merge(state, meta, patch map[string]any, now int64) (map[string]any, map[string]any) {
	if state == nil {
		state = map[string]any{}
	}
	if meta == nil {
		meta = map[string]any{}
	}
	for k, v := range patch {
		switch pv := v.(type) {
		case nil:
			delete(state, k)
			delete(meta, k)
		case map[string]any:
			sub, isObj := state[k].(map[string]any)
			subMeta, _ := meta[k].(map[string]any)
			if !isObj {
				sub, subMeta = nil, nil
			}
			state[k], meta[k] = merge(sub, subMeta, pv, now)
		default:
			state[k] = cloneValue(pv)
			meta[k] = map[string]any{timestampField: json.Number(strconv.FormatInt(now, 10))}
		}
	}
	return state, meta
}

// delta returns the fields of desired, recursively, that reported does not
// have with an equal value; nil when there are none.
func delta(desired, reported map[string]any) map[string]any {
	var out map[string]any
	for k, dv := range desired {
		rv, ok := reported[k]
		var diff any
		switch dobj := dv.(type) {
		case map[string]any:
			robj, isObj := rv.(map[string]any)
			switch {
			case !ok || !isObj:
				diff = cloneObject(dobj)
			default:
				if d := delta(dobj, robj); d != nil {
					diff = d
				}
			}
		default:
			if !ok || !equalValue(dv, rv) {
				diff = cloneValue(dv)
			}
		}
		if diff == nil {
			continue
		}
		if out == nil {
			out = map[string]any{}
		}
		out[k] = diff
	}
	return out
}

// equalValue compares two decoded JSON values; numbers are equal when
// their text is, or when both parse to the same float64 (1 and 1.0).
func equalValue(a, b any) bool {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok || len(av) != len(bv) {
			return false
		}
		for k, x := range av {
			y, ok := bv[k]
			if !ok || !equalValue(x, y) {
				return false
			}
		}
		return true
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			return false
		}
		for i := range av {
			if !equalValue(av[i], bv[i]) {
				return false
			}
		}
		return true
	case json.Number:
		bv, ok := b.(json.Number)
		if !ok {
			return false
		}
		if av == bv {
			return true
		}
		x, err1 := av.Float64()
		y, err2 := bv.Float64()
		return err1 == nil && err2 == nil && x == y
	case nil:
		return b == nil
	default: // string, bool
		return a == b
	}
}

// withDelta returns d with State.Delta computed from its sections.
func (d *Document) withDelta() *Document {
	d.State.Delta = delta(d.State.Desired, d.State.Reported)
	return d
}

// stateBytes is the size the document's limit applies to: its two
// sections as JSON (metadata and delta follow from them).
func (d *Document) stateBytes() int {
	b, _ := json.Marshal(struct {
		D map[string]any `json:"desired,omitempty"`
		R map[string]any `json:"reported,omitempty"`
	}{d.State.Desired, d.State.Reported})
	return len(b)
}
