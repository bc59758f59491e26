package shadow

// SkipEvents makes a JetStream-backed service store changes without
// appending their events or marking them while skip returns true: what a
// node killed between the two leaves behind.
func SkipEvents(s *Service, skip func() bool) {
	s.b.(*kvBackend).skipEvent.Store(&skip)
}
