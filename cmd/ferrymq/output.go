package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ferrymq/ferrymq/core"
)

// Output of the client commands: tables and lines for people, JSON for
// scripts (--json). Documents (lists, descriptions, lag) are indented JSON;
// messages are one compact JSON object per line (JSON Lines), the same
// record in consume, msg get and msg find.

// messageRecord is the JSON form of a message. Its keys are a contract
// with the scripts that read it: id, topic, queue, offset, key, tags,
// props, body, born_at, stored_at, reconsume — plus body_base64: true when
// the body is not UTF-8 and body holds its base64.
type messageRecord struct {
	ID         string            `json:"id"`
	Topic      string            `json:"topic"`
	Queue      int               `json:"queue"`
	Offset     int64             `json:"offset"`
	Key        string            `json:"key"`
	Tags       []string          `json:"tags"`
	Props      map[string]string `json:"props"`
	Body       string            `json:"body"`
	BodyBase64 bool              `json:"body_base64,omitempty"`
	BornAt     time.Time         `json:"born_at"`
	StoredAt   time.Time         `json:"stored_at"`
	Reconsume  int               `json:"reconsume"`
}

func newMessageRecord(m *core.StoredMessage) messageRecord {
	r := messageRecord{ID: m.ID.String(), Topic: m.Topic, Queue: m.Queue, Offset: m.QueueOffset, Key: m.ShardingKey,
		Tags: []string{}, Props: map[string]string{}, BornAt: m.BornAt, StoredAt: m.StoredAt, Reconsume: m.ReconsumeCount}
	if m.Tag != "" {
		r.Tags = append(r.Tags, m.Tag)
	}
	maps.Copy(r.Props, m.Properties)
	if utf8.Valid(m.Body) {
		r.Body = string(m.Body)
	} else {
		r.Body = base64.StdEncoding.EncodeToString(m.Body)
		r.BodyBase64 = true
	}
	return r
}

// writeJSONLine writes v as one compact line.
func writeJSONLine(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// writeJSON writes v as an indented document.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// newTable returns a writer that aligns tab-separated columns; Flush it.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// messageLine is the one-line form of a message for people:
//
//	orders/3@17 id=01… key=car-1 tag=created props=a=1,b=2 reconsume=1 body="hello"
func messageLine(m *core.StoredMessage) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%d@%d id=%s", m.Topic, m.Queue, m.QueueOffset, m.ID)
	if m.ShardingKey != "" {
		fmt.Fprintf(&b, " key=%s", displayText(m.ShardingKey))
	}
	if m.Tag != "" {
		fmt.Fprintf(&b, " tag=%s", displayText(m.Tag))
	}
	if len(m.Properties) > 0 {
		fmt.Fprintf(&b, " props=%s", displayProps(m.Properties))
	}
	if m.ReconsumeCount > 0 {
		fmt.Fprintf(&b, " reconsume=%d", m.ReconsumeCount)
	}
	fmt.Fprintf(&b, " body=%s", displayBody(m.Body))
	return b.String()
}

// displayBody shows a body on one line: quoted if it is UTF-8, else
// base64:….
func displayBody(body []byte) string {
	if utf8.Valid(body) {
		return strconv.Quote(string(body))
	}
	return "base64:" + base64.StdEncoding.EncodeToString(body)
}

// displayText returns s as is when it is plain (printable, no spaces, no
// quotes, commas or equals signs), else quoted.
func displayText(s string) string {
	if s == "" {
		return `""`
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) || strings.ContainsRune(`",=`, r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// displayProps shows properties sorted by name: a=1,b=2.
func displayProps(props map[string]string) string {
	parts := make([]string, 0, len(props))
	for _, k := range slices.Sorted(maps.Keys(props)) {
		parts = append(parts, displayText(k)+"="+displayText(props[k]))
	}
	return strings.Join(parts, ",")
}

// displayTime shows a time in UTC to the millisecond, or "-" if unset.
func displayTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// truncate shortens s to at most n runes, marking a cut with "…".
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
