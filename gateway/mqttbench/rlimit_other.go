//go:build !unix

package mqttbench

import "math"

// raiseFileLimit does nothing where there is no RLIMIT_NOFILE.
func raiseFileLimit() (uint64, error) { return math.MaxUint64, nil }
