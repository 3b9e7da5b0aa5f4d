package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
)

// A daemon in a container with a memory limit is killed when it reaches
// it, whatever the Go runtime would have collected. Unless GOMEMLIMIT
// says otherwise, each daemon sets the runtime's soft memory limit to a
// share of its cgroup's limit, so the GC works harder near the limit
// instead of the kernel killing the process. The rest of the limit is
// left to what the Go heap does not count: nft processes the agent runs
// (a full replace of a large table needs ~100 MB), stacks and the
// runtime's own overhead.
const memoryLimitShare = 0.75

// Where cgroup file systems are mounted, and where the process's cgroup
// is named.
const (
	cgroupRoot = "/sys/fs/cgroup"
	procCgroup = "/proc/self/cgroup"
)

// applyGCPercent sets the runtime's garbage-collection target to percent
// unless GOGC is set (the operator's choice wins) or percent is 0, and
// returns what it set (0: nothing). A daemon whose heap is mostly
// long-lived caches, as moat-agent's informers and compiled policy are,
// needs less than Go's default room of 100% above its live heap for the
// garbage of its events: at 50% moat-agent's resident memory at 30,000
// pods falls from 150-161 to 122-126 MB, for 12-26% more CPU per event
// it compiles (BENCHMARKS.md, Agent).
func applyGCPercent(percent int) int {
	if percent <= 0 || os.Getenv("GOGC") != "" {
		return 0
	}
	debug.SetGCPercent(percent)
	return percent
}

// applyMemoryLimit sets the soft memory limit from the cgroup's (see
// memoryLimitShare) and returns what it set, 0 when it set nothing: when
// GOMEMLIMIT is set, or there is no limit to read. root is the cgroup
// file system's mount, procCgroup the process's /proc/self/cgroup.
func applyMemoryLimit(root, procCgroup string) (int64, error) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	cg, err := os.ReadFile(procCgroup)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("cgroup memory limit: %w", err)
	}
	limit, err := cgroupMemoryLimit(root, string(cg))
	if err != nil || limit <= 0 {
		return 0, err
	}
	soft := int64(float64(limit) * memoryLimitShare)
	debug.SetMemoryLimit(soft)
	return soft, nil
}

// cgroupMemoryLimit reads the memory limit of the process's cgroup, as
// /proc/self/cgroup (procCgroup) names it under root: cgroup v2's
// memory.max ("0::/path"), else v1's memory.limit_in_bytes
// ("N:memory:/path" under root/memory). In a container with its own
// cgroup namespace the path is "/". It returns 0 for no limit ("max",
// v1's near-MaxInt64 value, or no file).
func cgroupMemoryLimit(root, procCgroup string) (int64, error) {
	var files []string
	for _, line := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			files = append(files, filepath.Join(root, f[2], "memory.max"))
		case slices.Contains(strings.Split(f[1], ","), "memory"):
			files = append(files, filepath.Join(root, "memory", f[2], "memory.limit_in_bytes"))
		}
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("cgroup memory limit: %w", err)
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, nil
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cgroup memory limit: %s: %q is not a number", file, s)
		}
		// cgroup v1 spells "no limit" as a page-rounded MaxInt64.
		if v >= math.MaxInt64/2 {
			continue
		}
		return v, nil
	}
	return 0, nil
}
