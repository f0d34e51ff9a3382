package overlap

import (
	"bufio"
	"bytes"
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"unsafe"
)

// An engine checks, before it allocates, that the host memory its buckets
// may come to hold fits in what the machine can give, so that an
// impossible configuration (a million buckets, a bucket of 2³¹ elements on
// a small machine) is a *MemoryError on every rank rather than the Go
// runtime's fatal "out of memory". What the machine can give is
// MemAvailable of /proc/meminfo, or, where lower, what the memory cgroup
// mounted at /sys/fs/cgroup (a container's own; v2 memory.max, or v1
// memory.limit_in_bytes, less the usage) still allows; an engine takes at
// most shareNum/shareDen of it, leaving the rest to everything else the
// process and the machine allocate meanwhile. Where neither can be read (not
// Linux), only maxHostBytes bounds the need.
const (
	shareNum, shareDen = 7, 8
	maxHostBytes       = 1 << 47 // the x86-64 user address space
)

// MemoryError reports host memory an engine would need that the machine
// cannot give; nothing was allocated. New returns it wrapped in this rank's
// *ConfigError, the other ranks get a *ConfigError naming this rank.
type MemoryError struct {
	What      string // what needs it, e.g. "buffers of 3 buckets (decision compressed)"
	Need      uint64 // bytes
	Available uint64 // bytes the machine can give (0: unknown)
}

func (e *MemoryError) Error() string {
	if e.Available == 0 {
		return fmt.Sprintf("%s need %s, more than any host can address (%s)", e.What, gib(e.Need), gib(maxHostBytes))
	}
	return fmt.Sprintf("%s need %s; this machine can give %s, of which an engine takes at most %d/%d",
		e.What, gib(e.Need), gib(e.Available), shareNum, shareDen)
}

func gib(b uint64) string { return fmt.Sprintf("%d bytes (%.3g GiB)", b, float64(b)/(1<<30)) }

// fits returns a *MemoryError when need bytes of host memory, for what,
// are more than the machine can give an engine.
func fits(what string, need uint64) error {
	avail, known := availableMemory()
	switch {
	case need > maxHostBytes:
		return &MemoryError{What: what, Need: need}
	case known && need > avail/shareDen*shareNum:
		return &MemoryError{What: what, Need: need, Available: avail}
	}
	return nil
}

// availableMemory returns the bytes of memory this process can still get,
// and whether it could tell (see fits).
func availableMemory() (uint64, bool) {
	avail, known := memInfoAvailable()
	for _, cg := range [][2]string{
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
	} {
		limit, ok1 := readBytes(cg[0])
		used, ok2 := readBytes(cg[1])
		if ok1 && ok2 {
			left := limit - min(used, limit)
			if !known || left < avail {
				avail, known = left, true
			}
			break
		}
	}
	return avail, known
}

// memInfoAvailable reads MemAvailable from /proc/meminfo.
func memInfoAvailable() (uint64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "MemAvailable:" && f[2] == "kB" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			return kb * 1024, err == nil
		}
	}
	return 0, false
}

// readBytes reads a cgroup file holding a byte count ("max": no limit,
// which is not a count).
func readBytes(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil
}

// recordBytesPerBucket bounds a bucket's share of a handshake record: the
// field "bucket 4294967295 elements", its value and their two lengths.
const recordBytesPerBucket = 48

// bookkeeping is the host memory buckets take on ranks ranks whatever
// their path: each one's bucket, and its share of every rank's handshake
// record, which the handshake gathers.
func bookkeeping(buckets, ranks int) uint64 {
	var need bytesNeed
	need.addTimes(uint64(buckets), uint64(unsafe.Sizeof(bucket{}))+8+recordBytesPerBucket*uint64(ranks))
	return uint64(need)
}

// bytesNeed adds up byte counts, saturating instead of wrapping around.
type bytesNeed uint64

func (n *bytesNeed) add(v uint64) {
	s, carry := bits.Add64(uint64(*n), v, 0)
	if carry != 0 {
		s = ^uint64(0)
	}
	*n = bytesNeed(s)
}

// addTimes adds count·each, saturating.
func (n *bytesNeed) addTimes(count, each uint64) {
	hi, lo := bits.Mul64(count, each)
	if hi != 0 {
		lo = ^uint64(0)
	}
	n.add(lo)
}
