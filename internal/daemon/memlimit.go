package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
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

// cgroupRoot is where the process's cgroup files are (its own cgroup
// namespace in a container).
const cgroupRoot = "/sys/fs/cgroup"

// applyMemoryLimit sets the soft memory limit from the cgroup's (see
// memoryLimitShare) and returns what it set, 0 when it set nothing: when
// GOMEMLIMIT is set, or there is no limit to read.
func applyMemoryLimit(root string) (int64, error) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	limit, err := cgroupMemoryLimit(root)
	if err != nil || limit <= 0 {
		return 0, err
	}
	soft := int64(float64(limit) * memoryLimitShare)
	debug.SetMemoryLimit(soft)
	return soft, nil
}

// cgroupMemoryLimit reads the memory limit of the cgroup at root: cgroup
// v2's memory.max, else v1's memory/memory.limit_in_bytes. It returns 0
// for no limit ("max", v1's near-MaxInt64 value, or neither file).
func cgroupMemoryLimit(root string) (int64, error) {
	for _, name := range []string{"memory.max", filepath.Join("memory", "memory.limit_in_bytes")} {
		b, err := os.ReadFile(filepath.Join(root, name))
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
			return 0, fmt.Errorf("cgroup memory limit: %s: %q is not a number", name, s)
		}
		// cgroup v1 spells "no limit" as a page-rounded MaxInt64.
		if v >= math.MaxInt64/2 {
			return 0, nil
		}
		return v, nil
	}
	return 0, nil
}
