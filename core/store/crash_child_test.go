package store

func runCrashChild() bool { return false }
