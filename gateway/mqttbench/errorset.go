package mqttbench

import "sync"

// maxDistinctErrors bounds the distinct messages an errorSet keeps; later
// ones are counted under "other errors".
const maxDistinctErrors = 8

// errorSet counts errors by message, keeping the order of first sight.
// It is safe for concurrent use.
type errorSet struct {
	mu     sync.Mutex
	counts []ErrorCount
}

func (s *errorSet) add(err error) {
	if err == nil {
		return
	}
	msg := err.Error()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.counts {
		if s.counts[i].Err == msg {
			s.counts[i].Count++
			return
		}
	}
	if len(s.counts) >= maxDistinctErrors {
		msg = "other errors"
		if last := &s.counts[len(s.counts)-1]; last.Err == msg {
			last.Count++
			return
		}
	}
	s.counts = append(s.counts, ErrorCount{Err: msg, Count: 1})
}

func (s *errorSet) list() []ErrorCount {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ErrorCount(nil), s.counts...)
}
