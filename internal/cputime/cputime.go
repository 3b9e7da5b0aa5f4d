// Package cputime reads the CPU time this process has used, which
// benchmarks report beside wall time: on a machine shared with other work
// the CPU time of the work varies far less than its elapsed time, so it is
// the figure to compare designs by.
package cputime

import (
	"syscall"
	"time"
)

// Process is the user and system CPU time of the whole process so far: all
// threads, the garbage collector's included, not its children's. It is 0
// if the kernel will not say (getrusage does not fail for RUSAGE_SELF).
func Process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
