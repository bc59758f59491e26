package brokertest

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/ferrymq/ferrymq/core"
)

// KeyOrder checks what one consumer got of messages whose bodies are
// "key/sequence": every (key, sequence) at least once, and no message
// before an earlier one of its key had been delivered (a redelivery is a
// repeat of something already delivered, not a violation). Safe for
// concurrent use by listeners.
type KeyOrder struct {
	// Base is every key's first sequence (a replay from a time: not 0).
	// Set it before the first Add.
	Base int

	mu        sync.Mutex
	next      map[string]int // per key: every sequence below it was delivered
	seen      map[string]map[int]bool
	distinct  int
	total     int
	violation string
}

// NewKeyOrder returns an empty KeyOrder.
func NewKeyOrder() *KeyOrder {
	return &KeyOrder{next: map[string]int{}, seen: map[string]map[int]bool{}}
}

// Add records one delivery of m.
func (o *KeyOrder) Add(m *core.StoredMessage) {
	key, seqText, _ := strings.Cut(string(m.Body), "/")
	seq, _ := strconv.Atoi(seqText)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.total++
	s := o.seen[key]
	if s == nil {
		s = map[int]bool{}
		o.seen[key] = s
		o.next[key] = max(o.next[key], o.Base)
	}
	if !s[seq] {
		o.distinct++
		s[seq] = true
	}
	if seq > o.next[key] && o.violation == "" {
		o.violation = fmt.Sprintf("key %s: %d delivered before %d (queue %d offset %d)", key, seq, o.next[key], m.Queue, m.QueueOffset)
	}
	for s[o.next[key]] {
		o.next[key]++
	}
}

// Counts returns the distinct messages delivered, all deliveries, and the
// first order violation ("" if none).
func (o *KeyOrder) Counts() (distinct, total int, violation string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.distinct, o.total, o.violation
}

// Distinct is the number of distinct messages delivered.
func (o *KeyOrder) Distinct() int {
	d, _, _ := o.Counts()
	return d
}

// Violation is the first order violation, "" if none.
func (o *KeyOrder) Violation() string {
	_, _, v := o.Counts()
	return v
}
