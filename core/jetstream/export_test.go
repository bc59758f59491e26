package jetstream

// Republished is how many publishes a resize's fence refused that e
// published again with the new epoch.
func Republished(e *Engine) int64 { return e.republished.Load() }
