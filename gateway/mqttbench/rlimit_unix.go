//go:build unix

package mqttbench

import (
	"fmt"
	"syscall"
)

// raiseFileLimit raises this process's soft limit on open files to the
// hard limit and returns the limit in force. (Go does this itself at start
// since 1.19; doing it here keeps the tool right when embedded.) Where the
// hard limit cannot be set (macOS caps it below "unlimited"), the soft
// limit stays and is returned: Run then says how many connections fit.
func raiseFileLimit() (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("get RLIMIT_NOFILE: %w", err)
	}
	if l.Cur < l.Max {
		raised := l
		raised.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			l = raised
		}
	}
	return uint64(l.Cur), nil
}
