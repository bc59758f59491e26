package bucket

import "github.com/ferrymq/ferrymq/core/shadow"

// SkipEvents makes a bucket-backed service store changes without
// appending their events or marking them while skip returns true: what a
// node killed between the two leaves behind.
func SkipEvents(s *shadow.Service, skip func() bool) {
	s.Backend().(*Backend).skipEvent.Store(&skip)
}
