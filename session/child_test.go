package session

// maybeChild runs the test binary as a child process when asked to (the
// kill -9 tests); otherwise it returns at once.
func maybeChild() {}
