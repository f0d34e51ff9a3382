package overlap

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"

	"github.com/gradcomp/gradcomp/compress"
)

// The engine state format, version 2, little-endian:
//
//	"GCOV", version (1 byte)
//	world size (uint32), rank (uint32), next step (uint64)
//	spec length (uint32), spec; strategy (1 byte), error feedback (1 byte)
//	bucket count (uint32), per bucket its element count (uint64)
//	per memory (stage 1, then SRA's stage 2): present (1 byte), then, if
//	  1, the memory as compress.ErrorFeedback.Save writes it
//	momentum (float64, Config.Momentum); per bucket: present (1 byte),
//	  then, if 1, its momentum-correction velocity u (element count ×
//	  float32)
//	per bucket: the accuracy guard's pending flush (Config.Guard): the
//	  length of its reason (uint16, 0: none), the reason (UTF-8)
//	CRC32C of every byte before it (uint32)
//
// Version 2 is version 3 without the guard part, version 1 version 2
// without the momentum part; Load reads all three.
const (
	stateMagic   = "GCOV"
	stateVersion = 3
	maxSpecLen   = 1 << 12
	maxGuardLen  = 1 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Save writes the engine's state, both error-feedback memories and the
// next step number, to w. It fails with a *UsageError while a step is in
// flight. It works after a failed step (the memory then holds what the
// backend keeps: Engine e + g, DeviceEngine e); an Engine saves after
// Close too, a DeviceEngine (whose memory Close frees) does not. The
// format is the same for every backend: a state moves between the CPU and
// a GPU.
func (e *core) Save(w io.Writer) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur != nil {
		return &UsageError{Call: "Save", Err: ErrStepInFlight, Detail: fmt.Sprintf("step %d: call Wait first", e.cur.num)}
	}
	gradEF, partEF, err := e.be.memory("Save")
	if err != nil {
		return err
	}
	velocity := make([][]float32, len(e.buckets))
	for i := range velocity {
		if velocity[i], err = e.be.velocity(i); err != nil {
			return fmt.Errorf("overlap: Save on rank %d: bucket %d's momentum velocity: %w", e.rank, i, err)
		}
	}
	crc := crc32.New(castagnoli)
	bw := bufio.NewWriter(io.MultiWriter(w, crc))
	bw.WriteString(stateMagic)
	bw.WriteByte(stateVersion)
	var b [8]byte
	put32 := func(v uint32) { binary.LittleEndian.PutUint32(b[:4], v); bw.Write(b[:4]) }
	put64 := func(v uint64) { binary.LittleEndian.PutUint64(b[:], v); bw.Write(b[:]) }
	put32(uint32(e.size))
	put32(uint32(e.rank))
	put64(e.next)
	put32(uint32(len(e.spec)))
	bw.WriteString(e.spec)
	bw.WriteByte(byte(e.strategy))
	bw.WriteByte(boolByte(e.cfg.ErrorFeedback))
	put32(uint32(len(e.buckets)))
	for _, bk := range e.buckets {
		put64(uint64(bk.n))
	}
	for _, f := range []*compress.ErrorFeedback{gradEF, partEF} {
		bw.WriteByte(boolByte(f != nil))
		if f == nil {
			continue
		}
		if err := bw.Flush(); err != nil {
			return fmt.Errorf("overlap: saving engine state: %w", err)
		}
		if err := f.Save(io.MultiWriter(w, crc)); err != nil {
			return fmt.Errorf("overlap: saving engine state: %w", err)
		}
	}
	put64(math.Float64bits(e.cfg.Momentum))
	for _, u := range velocity {
		bw.WriteByte(boolByte(u != nil))
		for _, v := range u {
			put32(math.Float32bits(v))
		}
	}
	for _, bk := range e.buckets {
		binary.LittleEndian.PutUint16(b[:2], uint16(len(bk.guard)))
		bw.Write(b[:2])
		bw.WriteString(bk.guard)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("overlap: saving engine state: %w", err)
	}
	binary.LittleEndian.PutUint32(b[:4], crc.Sum32())
	if _, err := w.Write(b[:4]); err != nil {
		return fmt.Errorf("overlap: saving engine state: %w", err)
	}
	return nil
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// Load replaces the engine's error-feedback memories and step number with
// a state Save wrote. The state must come from an engine with the same
// spec, error-feedback flag and bucket layout, else a *StateError; it is
// validated whole (format, checksum, residual lengths) before anything is
// replaced, so on error the engine is unchanged. The stage-1 memory is
// per bucket and loads under any world size and rank; SRA's second memory
// belongs to this rank's part of each bucket, and loads only into the same
// rank of a group of the same size with the same strategy: otherwise it
// starts empty (its content, the re-quantization error of the averaged
// gradient, is a fraction of one step's update). Load fails with a
// *UsageError while a step is in flight or (DeviceEngine) after Close.
func (e *core) Load(r io.Reader) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur != nil {
		return &UsageError{Call: "Load", Err: ErrStepInFlight, Detail: fmt.Sprintf("step %d: call Wait first", e.cur.num)}
	}
	if e.closed {
		if _, _, err := e.be.memory("Load"); err != nil {
			return err
		}
	}
	crc := crc32.New(castagnoli)
	tr := io.TeeReader(r, crc)
	var b [8]byte
	var rerr error
	read := func(p []byte) bool {
		if rerr == nil {
			if _, err := io.ReadFull(tr, p); err != nil {
				rerr = &StateError{Reason: "truncated", Err: err}
			}
		}
		return rerr == nil
	}
	get32 := func() uint32 { read(b[:4]); return binary.LittleEndian.Uint32(b[:4]) }
	get64 := func() uint64 { read(b[:]); return binary.LittleEndian.Uint64(b[:]) }
	var hdr [5]byte
	if !read(hdr[:]) {
		return rerr
	}
	if string(hdr[:4]) != stateMagic {
		return &StateError{Reason: fmt.Sprintf("bad magic %q, want %q", hdr[:4], stateMagic)}
	}
	if hdr[4] < 1 || hdr[4] > stateVersion {
		return &StateError{Reason: fmt.Sprintf("format version %d, this build reads versions 1 to %d", hdr[4], stateVersion)}
	}
	size, rank, next := int(get32()), int(get32()), get64()
	specLen := get32()
	if rerr != nil {
		return rerr
	}
	if specLen > maxSpecLen {
		return &StateError{Reason: fmt.Sprintf("spec length %d exceeds %d", specLen, maxSpecLen)}
	}
	spec := make([]byte, specLen)
	var flags [2]byte
	read(spec)
	read(flags[:])
	count := get32()
	if rerr != nil {
		return rerr
	}
	switch {
	case string(spec) != e.spec:
		return &StateError{Reason: fmt.Sprintf("saved with spec %s, this engine has %s", spec, e.spec)}
	case (flags[1] == 1) != e.cfg.ErrorFeedback:
		return &StateError{Reason: fmt.Sprintf("saved with error feedback %v, this engine has %v", flags[1] == 1, e.cfg.ErrorFeedback)}
	case int(count) != len(e.buckets):
		return &StateError{Reason: fmt.Sprintf("saved with %d buckets, this engine has %d", count, len(e.buckets))}
	}
	for i, bk := range e.buckets {
		if n := get64(); rerr == nil && n != uint64(bk.n) {
			return &StateError{Reason: fmt.Sprintf("bucket %d has %d elements in the state, %d in this engine", i, n, bk.n)}
		}
	}
	var mem [2]*compress.ErrorFeedback
	for stage, f := range []compress.Compressor{e.mem1, e.mem2} {
		var present [1]byte
		if !read(present[:]) {
			return rerr
		}
		if present[0] == 0 {
			continue
		}
		if f == nil && stage == 0 {
			return &StateError{Reason: "the state has error-feedback memory, this engine has none"}
		}
		if f == nil {
			f = e.comp // read to skip: SRA's memory in another strategy's engine
		}
		fresh := compress.NewErrorFeedback(f)
		if err := fresh.Load(tr); err != nil {
			return &StateError{Reason: fmt.Sprintf("stage-%d error-feedback memory", stage+1), Err: err}
		}
		mem[stage] = fresh
	}
	momentum, velocity, err := e.readVelocity(hdr[4], get64, read)
	if rerr != nil {
		return rerr
	}
	if err != nil {
		return err
	}
	guards, err := e.readGuards(hdr[4], read)
	if rerr != nil {
		return rerr
	}
	if err != nil {
		return err
	}
	if momentum != e.cfg.Momentum {
		return &StateError{Reason: fmt.Sprintf("saved with momentum %v, this engine has %v", momentum, e.cfg.Momentum)}
	}
	want := crc.Sum32()
	if _, err := io.ReadFull(r, b[:4]); err != nil {
		return &StateError{Reason: "truncated before its checksum", Err: err}
	}
	if got := binary.LittleEndian.Uint32(b[:4]); got != want {
		return &StateError{Reason: fmt.Sprintf("checksum %#08x, contents hash to %#08x", got, want)}
	}
	if err := e.checkMemory(mem[0], 1, func(bk *bucket) int { return bk.n }); err != nil {
		return err
	}
	keep2 := mem[1] != nil && e.mem2 != nil && size == e.size && rank == e.rank && Strategy(flags[0]) == e.strategy
	if keep2 {
		// This rank's part of each bucket (the bucket's buffers exist only
		// once it has taken the compressed path).
		part := &parts{count: e.size}
		if err := e.checkMemory(mem[1], 2, func(bk *bucket) int { lo, hi := part.bounds(bk.n, e.rank); return hi - lo }); err != nil {
			return err
		}
	}
	if mem[0] == nil && e.mem1 != nil {
		mem[0] = compress.NewErrorFeedback(e.mem1)
	}
	if !keep2 {
		mem[1] = nil
		if e.mem2 != nil {
			mem[1] = compress.NewErrorFeedback(e.mem2)
		}
	}
	if err := e.be.install(mem[0], mem[1]); err != nil {
		return err
	}
	if err := e.be.setVelocity(velocity); err != nil {
		return err
	}
	for i, bk := range e.buckets {
		bk.guard = ""
		if e.cfg.Guard > 0 {
			bk.guard = guards[i]
		}
	}
	e.next = next
	return nil
}

// readGuards reads the accuracy guard's part of a version-3 state (older
// versions: no flush pending): per bucket the reason of its pending
// flush, or "".
func (e *core) readGuards(version byte, read func([]byte) bool) ([]string, error) {
	guards := make([]string, len(e.buckets))
	if version < 3 {
		return guards, nil
	}
	for i := range guards {
		var l [2]byte
		if !read(l[:]) {
			return nil, nil
		}
		n := binary.LittleEndian.Uint16(l[:])
		if n > maxGuardLen {
			return nil, &StateError{Reason: fmt.Sprintf("bucket %d's accuracy-guard reason has %d bytes, more than %d", i, n, maxGuardLen)}
		}
		reason := make([]byte, n)
		if !read(reason) {
			return nil, nil
		}
		guards[i] = string(reason)
	}
	return guards, nil
}

// readVelocity reads the momentum part of a version-2 state (version 1:
// momentum 0, no velocities): the momentum and, per bucket, its velocity
// or nil. A non-finite velocity is a *StateError.
func (e *core) readVelocity(version byte, get64 func() uint64, read func([]byte) bool) (float64, [][]float32, error) {
	velocity := make([][]float32, len(e.buckets))
	if version == 1 {
		return 0, velocity, nil
	}
	momentum := math.Float64frombits(get64())
	for i, bk := range e.buckets {
		var present [1]byte
		if !read(present[:]) {
			return 0, nil, nil
		}
		if present[0] == 0 {
			continue
		}
		raw := make([]byte, 4*bk.n)
		if !read(raw) {
			return 0, nil, nil
		}
		u := make([]float32, bk.n)
		for j := range u {
			u[j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
			if u[j]-u[j] != 0 {
				return 0, nil, &StateError{Reason: fmt.Sprintf("momentum velocity of bucket %d holds %v at element %d", i, u[j], j)}
			}
		}
		velocity[i] = u
	}
	return momentum, velocity, nil
}

// checkMemory checks that every residual of f belongs to a bucket and has
// the length want gives.
func (e *core) checkMemory(f *compress.ErrorFeedback, stage int, want func(*bucket) int) error {
	if f == nil {
		return nil
	}
	for _, id := range f.Buckets() {
		if id >= uint64(len(e.buckets)) {
			return &StateError{Reason: fmt.Sprintf("stage-%d memory has bucket %d; this engine has %d buckets", stage, id, len(e.buckets))}
		}
		if l, w := len(f.Residual(id)), want(e.buckets[id]); l != w {
			return &StateError{Reason: fmt.Sprintf("stage-%d memory of bucket %d has %d elements, want %d", stage, id, l, w)}
		}
	}
	return nil
}

// StateInfo is what a saved engine state says about the engine that wrote
// it (see the format above).
type StateInfo struct {
	WorldSize, Rank int
	NextStep        uint64
	Spec            string // canonical
	Strategy        Strategy
	ErrorFeedback   bool
	Buckets         []int // element count per bucket
}

// InspectState reads the header of a state Save wrote, after checking its
// magic, version and checksum over all of b; it does not decode the
// error-feedback memories (Load validates those). A state that fails a
// check is a *StateError.
func InspectState(b []byte) (StateInfo, error) {
	var info StateInfo
	if len(b) < len(stateMagic)+1+4 {
		return info, &StateError{Reason: fmt.Sprintf("%d bytes, too short for an engine state", len(b))}
	}
	if string(b[:4]) != stateMagic {
		return info, &StateError{Reason: fmt.Sprintf("bad magic %q, want %q", b[:4], stateMagic)}
	}
	if b[4] < 1 || b[4] > stateVersion {
		return info, &StateError{Reason: fmt.Sprintf("format version %d, this build reads versions 1 to %d", b[4], stateVersion)}
	}
	body := b[:len(b)-4]
	if got, want := binary.LittleEndian.Uint32(b[len(b)-4:]), crc32.Checksum(body, castagnoli); got != want {
		return info, &StateError{Reason: fmt.Sprintf("checksum %#08x, contents hash to %#08x", got, want)}
	}
	p := body[5:]
	short := &StateError{Reason: "truncated header"}
	take := func(n int) []byte {
		if len(p) < n {
			return nil
		}
		v := p[:n]
		p = p[n:]
		return v
	}
	hdr := take(20)
	if hdr == nil {
		return info, short
	}
	info.WorldSize = int(binary.LittleEndian.Uint32(hdr))
	info.Rank = int(binary.LittleEndian.Uint32(hdr[4:]))
	info.NextStep = binary.LittleEndian.Uint64(hdr[8:])
	specLen := binary.LittleEndian.Uint32(hdr[16:])
	if specLen > maxSpecLen {
		return info, &StateError{Reason: fmt.Sprintf("spec length %d exceeds %d", specLen, maxSpecLen)}
	}
	spec := take(int(specLen))
	flags := take(2)
	count := take(4)
	if count == nil {
		return info, short
	}
	info.Spec, info.Strategy, info.ErrorFeedback = string(spec), Strategy(flags[0]), flags[1] == 1
	n := binary.LittleEndian.Uint32(count)
	if uint64(n)*8 > uint64(len(p)) {
		return info, &StateError{Reason: fmt.Sprintf("%d buckets, but only %d bytes follow", n, len(p))}
	}
	info.Buckets = make([]int, n)
	for i := range info.Buckets {
		v := binary.LittleEndian.Uint64(take(8))
		if v > compress.MaxElements {
			return info, &StateError{Reason: fmt.Sprintf("bucket %d has %d elements, more than %d", i, v, uint64(compress.MaxElements))}
		}
		info.Buckets[i] = int(v)
	}
	return info, nil
}
