package overlap

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"
	"strconv"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
)

// The engine state format, version 6, little-endian:
//
//	"GCOV", version (1 byte)
//	world size (uint32), rank (uint32), next step (uint64)
//	spec length (uint32), spec (canonical); strategy in use (1 byte:
//	  Config.Strategy resolved), error feedback (1 byte)
//	the other settings that shape the exchange: Config.Strategy as
//	  configured (1 byte, StrategyAuto included), momentum masking
//	  (1 byte), accuracy guard (float64, Config.Guard), schedule length
//	  (uint32), schedule (the phases with canonical specs as
//	  FormatSchedule writes them, "" for none)
//	the layout of StrategyHier (four uint32: nodes, ranks per node, this
//	  rank's node and local rank; all 0 for the flat strategies)
//	the feedback decay β (float64, Config.FeedbackDecay; 1 for none, as
//	  for FeedbackDecay 0)
//	bucket count (uint32), per bucket its element count (uint64)
//	StrategyHier: the state of the engine across nodes (uint64 length,
//	  then that state, in this format, with its own checksum), and
//	  nothing of the following but the checksum; else:
//	per memory (stage 1, then SRA's stage 2): present (1 byte), then, if
//	  1, the memory as compress.ErrorFeedback.Save writes it
//	momentum (float64, Config.Momentum); per bucket: present (1 byte),
//	  then, if 1, its momentum-correction velocity u (element count ×
//	  float32)
//	per bucket: the accuracy guard's pending flush (Config.Guard): the
//	  length of its reason (uint16, 0: none), the reason (UTF-8)
//	CRC32C of every byte before it (uint32)
//
// Version 5 is version 6 without the feedback decay (a state of β = 1),
// version 4 version 5 without the layout, version 3 version 4 without
// the settings after the error-feedback
// byte, version 2 version 3 without the guard part, version 1 version 2
// without the momentum part; Load reads all five and checks every
// setting a version records against the engine (checkSettings; the
// configured strategy only where the strategies in use differ, which is
// allowed between two engines configured auto). What the state does not
// record are run-time settings, which may change on resume: Decision,
// Warmup (it moves where a Schedule's phases start), Timeout, Workers and
// FailOnNonFinite.
const (
	stateMagic     = "GCOV"
	stateVersion   = 6
	maxNestedState = 1 << 46
	maxSpecLen     = 1 << 12
	maxScheduleLen = 1 << 16
	maxGuardLen    = 1 << 10
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
	bw.WriteByte(byte(e.cfg.Strategy))
	bw.WriteByte(boolByte(e.cfg.MomentumMasking))
	put64(math.Float64bits(e.cfg.Guard))
	sched := schedule(e)
	put32(uint32(len(sched)))
	bw.WriteString(sched)
	for _, v := range []int{e.layout.Nodes, e.layout.LocalSize, e.layout.Node, e.layout.LocalRank} {
		put32(uint32(v))
	}
	put64(math.Float64bits(e.cfg.decay()))
	put32(uint32(len(e.buckets)))
	for _, bk := range e.buckets {
		put64(uint64(bk.n))
	}
	if n, ok := e.be.(nester); ok {
		var nested bytes.Buffer
		if err := n.nestedCore().Save(&nested); err != nil {
			return err
		}
		put64(uint64(nested.Len()))
		bw.Write(nested.Bytes())
		return finishState(w, bw, crc)
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
	return finishState(w, bw, crc)
}

// finishState flushes bw, which writes to w through crc, and appends the
// checksum.
func finishState(w io.Writer, bw *bufio.Writer, crc hash.Hash32) error {
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("overlap: saving engine state: %w", err)
	}
	if _, err := w.Write(binary.LittleEndian.AppendUint32(nil, crc.Sum32())); err != nil {
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
// settings, as far as its version records them (see the format above:
// spec, strategy, error feedback, momentum, momentum masking, accuracy
// guard, schedule, feedback decay: a state older than version 6 is one of
// β = 1, which loads where FeedbackDecay is 0 or 1) and the same bucket
// layout, else a *StateError naming
// the setting and both values; it is validated whole (format, checksum,
// residual lengths) before anything is replaced, so on error the engine is
// unchanged. The strategy in use must be the engine's, unless both were
// configured StrategyAuto, which resolves with the world size and the
// backend (see checkStrategy). The stage-1 memory is per bucket and loads under any
// world size and rank; SRA's second memory belongs to this rank's part of
// each bucket, and loads only into the same rank of a group of the same
// size with the same strategy in use: otherwise it starts empty (its
// content, the re-quantization error of the averaged gradient, is a
// fraction of one step's update). Load fails with a *UsageError while a
// step is in flight or (DeviceEngine) after Close. CheckState makes the
// same checks without an engine.
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
	st, err := e.readState(r)
	if err != nil {
		return err
	}
	return e.apply(st)
}

// apply replaces e's memories, velocities, guards and step number with
// those of a state readState validated (StrategyHier: the engine across
// nodes takes its own).
func (e *core) apply(st *savedState) error {
	if st.nested != nil {
		if err := e.be.(nester).nestedCore().apply(st.nested); err != nil {
			return err
		}
		e.next = st.info.NextStep
		return nil
	}
	if err := e.be.install(st.mem[0], st.mem[1]); err != nil {
		return err
	}
	if err := e.be.setVelocity(st.velocity); err != nil {
		return err
	}
	for i, bk := range e.buckets {
		bk.guard = ""
		if e.cfg.Guard > 0 {
			bk.guard = st.guards[i]
		}
	}
	e.next = st.info.NextStep
	return nil
}

// CheckState reports whether Load would accept the state b (one state,
// all of b, as Save wrote it) into an engine of worldSize ranks built with
// cfg and sizes, placed at layout among the nodes (StrategyHier; the zero
// Topology: wherever b was saved), without building one: nil, or the
// error Load of b's bytes
// would return after InspectState (a *StateError, with the same message).
// It checks SRA's second memory as Load does on the rank that saved b
// (another rank's Load starts that memory empty instead). A cfg, sizes or
// worldSize that New would refuse is a *ConfigError with Rank -1 (wrapping
// a *MemoryError where the buckets' bookkeeping would not fit). The
// strategy auto resolves as on the host Engine; Load accepts a state of
// auto whatever it resolved to, so a DeviceEngine's Load agrees. Spec
// powersgd may come without Config.Shapes here: then everything but the
// lengths of the warm start's Q's is checked (Load checks them).
func CheckState(b []byte, cfg Config, sizes []int, worldSize int, layout comm.Topology) error {
	info, err := InspectState(b)
	if err != nil {
		return err
	}
	if worldSize < 1 || worldSize > math.MaxUint16 {
		return &ConfigError{Rank: -1, Reason: fmt.Sprintf("world size %d: want 1 to %d", worldSize, math.MaxUint16)}
	}
	c := &core{cfg: withDefaults(cfg), size: worldSize, checking: true}
	if info.Rank < worldSize {
		c.rank = info.Rank
	}
	if err := c.configure(sizes, resolve); err != nil {
		return &ConfigError{Rank: -1, Reason: err.Error(), Err: err}
	}
	if c.strategy == StrategyHier {
		c.layout = cmp.Or(layout, info.Layout)
	}
	_, err = c.readState(bytes.NewReader(b))
	return err
}

// savedState is a state readState validated, ready to install.
type savedState struct {
	info     StateInfo
	mem      [2]*compress.ErrorFeedback // stage 1, SRA's stage 2 (nil: start empty)
	velocity [][]float32
	guards   []string
	nested   *savedState // StrategyHier: the engine across nodes' state
}

// readState reads a state Save wrote from r and checks it against e
// whole: format, the settings it records (checkSettings), the bucket
// layout, the memories and velocities, the checksum. It changes nothing.
func (e *core) readState(r io.Reader) (*savedState, error) {
	sr := newStateReader(r)
	info, err := readHeader(sr)
	if err != nil {
		return nil, err
	}
	if err := e.checkSettings(info); err != nil {
		return nil, err
	}
	st := &savedState{info: info}
	if e.sharded() {
		if st.nested, err = e.readNested(sr); err != nil {
			return nil, err
		}
		if err := sr.checksum(r); err != nil {
			return nil, err
		}
		return st, nil
	}
	for stage, f := range []compress.Compressor{e.mem1, e.mem2} {
		if !sr.bool() {
			if sr.err != nil {
				return nil, sr.err
			}
			continue
		}
		if f == nil && stage == 0 {
			return nil, &StateError{Reason: "the state has error-feedback memory, this engine has none"}
		}
		if f == nil {
			f = e.comp // read to skip: SRA's memory in another strategy's engine
		}
		fresh := compress.NewErrorFeedback(f)
		if err := fresh.Load(sr.tee); err != nil {
			return nil, &StateError{Reason: fmt.Sprintf("stage-%d error-feedback memory", stage+1), Err: err}
		}
		st.mem[stage] = fresh
	}
	momentum, velocity, err := e.readVelocity(byte(info.Version), sr)
	if err == nil {
		st.velocity = velocity
		st.guards, err = e.readGuards(byte(info.Version), sr)
	}
	switch {
	case sr.err != nil:
		return nil, sr.err
	case err != nil:
		return nil, err
	case momentum != e.cfg.Momentum:
		return nil, settingError("momentum", formatFloat(momentum), formatFloat(e.cfg.Momentum))
	}
	if err := sr.checksum(r); err != nil {
		return nil, err
	}
	if err := e.checkMemory(st.mem[0], 1, func(bk *bucket) int { return bk.n }); err != nil {
		return nil, err
	}
	switch {
	case st.mem[1] == nil || e.mem2 == nil:
		st.mem[1] = nil
	case e.lowRank != nil && e.cfg.Shapes == nil:
		// CheckState without the shapes: the Q's lengths are checked
		// when the state is loaded into an engine.
	case e.lowRank != nil:
		// The warm start's Q's, the same on every rank: they resume on
		// any world size.
		if err := e.checkMemory(st.mem[1], 2, func(bk *bucket) int { return planLowRank(e.cfg.Shapes[bk.idx], *e.lowRank).QLen }); err != nil {
			return nil, err
		}
	case info.WorldSize == e.size && info.Rank == e.rank && info.Strategy == e.strategy:
		// This rank's part of each bucket (the bucket's buffers exist only
		// once it has taken the compressed path).
		part := &parts{count: e.size}
		if err := e.checkMemory(st.mem[1], 2, func(bk *bucket) int { lo, hi := part.bounds(bk.n, e.rank); return hi - lo }); err != nil {
			return nil, err
		}
	default:
		st.mem[1] = nil
	}
	if st.mem[0] == nil && e.mem1 != nil {
		st.mem[0] = compress.NewErrorFeedback(e.mem1)
	}
	if st.mem[1] == nil && e.mem2 != nil {
		st.mem[1] = compress.NewErrorFeedback(e.mem2)
	}
	return st, nil
}

// checkSettings checks the settings and the bucket layout a state's header
// records against e's: a *StateError naming the first that differs (or a
// strategy byte this build does not know, in any version).
func (e *core) checkSettings(info StateInfo) error {
	if info.Spec != e.spec {
		return settingError("spec", info.Spec, e.spec)
	}
	if err := e.checkStrategy(info); err != nil {
		return err
	}
	if info.ErrorFeedback != e.cfg.ErrorFeedback {
		return settingError("error feedback", onOff(info.ErrorFeedback), onOff(e.cfg.ErrorFeedback))
	}
	if info.Version >= 4 {
		switch {
		case info.MomentumMasking != e.cfg.MomentumMasking:
			return settingError("momentum masking", onOff(info.MomentumMasking), onOff(e.cfg.MomentumMasking))
		case info.Guard != e.cfg.Guard:
			return settingError("accuracy guard", formatFloat(info.Guard), formatFloat(e.cfg.Guard))
		case info.Schedule != schedule(e):
			return settingError("schedule", cmp.Or(info.Schedule, "none"), cmp.Or(schedule(e), "none"))
		}
	}
	if info.FeedbackDecay != e.cfg.decay() {
		return settingError("feedback decay", formatFloat(info.FeedbackDecay), formatFloat(e.cfg.decay()))
	}
	if err := e.checkLayoutOf(info); err != nil {
		return err
	}
	if len(info.Buckets) != len(e.buckets) {
		return &StateError{Reason: fmt.Sprintf("saved with %d buckets, this engine has %d", len(info.Buckets), len(e.buckets))}
	}
	for i, bk := range e.buckets {
		if n := info.Buckets[i]; n != bk.n {
			return &StateError{Reason: fmt.Sprintf("bucket %d has %d elements in the state, %d in this engine", i, n, bk.n)}
		}
	}
	return nil
}

// checkLayoutOf checks the layout a state was saved on against e's. The
// flat strategies and the two-level StrategyHier keep per-rank memories of
// whole buckets, which load under any layout (as under any world size).
// The sharded StrategyHier keeps the memories of this rank's shard of
// each bucket: they load where the shard is the same, with the same ranks
// per node and local rank, whatever the number of nodes and this rank's
// node (its engine across nodes takes them as a flat engine takes a state
// of another world size).
func (e *core) checkLayoutOf(info StateInfo) error {
	s, c := info.Layout, e.layout
	if s == c || !e.sharded() || s.LocalSize == c.LocalSize && s.LocalRank == c.LocalRank {
		return nil
	}
	saved, current := layoutName(s), layoutName(c)
	if saved == current {
		saved, current = describeTopology(s), describeTopology(c)
	}
	return settingError("layout", saved, current)
}

// checkStrategy checks a state's strategy against e's: the strategy in
// use must be e's, unless both were configured auto (which resolves with
// the world size and the backend), and then the state's must carry the
// spec's codec. Before version 4 the state does not record what was
// configured, and one in use that differs from e's loads when e's is auto.
// A strategy byte this build does not know is refused in any version.
func (e *core) checkStrategy(info StateInfo) error {
	known := func(s Strategy) bool { return s > StrategyAuto && s <= StrategyLowRank }
	switch {
	case !known(info.Strategy):
		return &StateError{Reason: fmt.Sprintf("strategy byte %d names no strategy this build knows", int(info.Strategy))}
	case info.Configured != StrategyAuto && !known(info.Configured):
		return &StateError{Reason: fmt.Sprintf("configured strategy byte %d names no strategy this build knows", int(info.Configured))}
	case info.Version >= 4 && info.Configured != StrategyAuto && info.Configured != info.Strategy:
		return &StateError{Reason: fmt.Sprintf("configured strategy %v, %v in use", info.Configured, info.Strategy)}
	case info.Strategy == e.strategy:
		return nil
	case e.cfg.Strategy != StrategyAuto || info.Version >= 4 && info.Configured != StrategyAuto:
		saved := info.Strategy.String()
		if info.Version >= 4 && info.Configured == StrategyAuto {
			saved = "auto (" + saved + ")"
		}
		current := e.strategy.String()
		if e.cfg.Strategy == StrategyAuto {
			current = "auto (" + current + ")"
		}
		return settingError("strategy", saved, current)
	}
	if e.comp == nil {
		return nil // codec none: the dense all-reduce, whatever the strategy
	}
	codec := e.comp.Codec()
	if e.lowRank != nil {
		codec = compress.CodecPowerSGD
	}
	if _, err := resolve(info.Strategy, codec, info.WorldSize); err != nil {
		return &StateError{Reason: fmt.Sprintf("strategy %v cannot carry spec %s", info.Strategy, info.Spec), Err: err}
	}
	return nil
}

// settingError is the *StateError of a state saved with setting = saved
// where this engine has current.
func settingError(setting, saved, current string) *StateError {
	return &StateError{Reason: fmt.Sprintf("saved with %s %s, this engine has %s", setting, saved, current),
		Setting: setting, Saved: saved, Current: current}
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// stateReader reads a state's fields in order, keeping the first error
// (a *StateError: truncated) and the CRC32C of what it read; after an
// error its reads return zeros.
type stateReader struct {
	tee io.Reader // the input, through the checksum
	crc hash.Hash32
	err error
	b   [8]byte
}

func newStateReader(r io.Reader) *stateReader {
	crc := crc32.New(castagnoli)
	return &stateReader{tee: io.TeeReader(r, crc), crc: crc}
}

// read fills p, reporting whether it could.
func (s *stateReader) read(p []byte) bool {
	if s.err == nil {
		if _, err := io.ReadFull(s.tee, p); err != nil {
			s.err = &StateError{Reason: "truncated", Err: err}
		}
	}
	if s.err != nil {
		clear(p)
	}
	return s.err == nil
}

func (s *stateReader) byte() byte   { s.read(s.b[:1]); return s.b[0] }
func (s *stateReader) bool() bool   { return s.byte() == 1 }
func (s *stateReader) u16() uint16  { s.read(s.b[:2]); return binary.LittleEndian.Uint16(s.b[:2]) }
func (s *stateReader) u32() uint32  { s.read(s.b[:4]); return binary.LittleEndian.Uint32(s.b[:4]) }
func (s *stateReader) u64() uint64  { s.read(s.b[:]); return binary.LittleEndian.Uint64(s.b[:]) }
func (s *stateReader) f64() float64 { return math.Float64frombits(s.u64()) }

// text reads a length (uint32, at most limit) and that many bytes.
func (s *stateReader) text(what string, limit int) string {
	n := s.u32()
	if s.err == nil && n > uint32(limit) {
		s.err = &StateError{Reason: fmt.Sprintf("%s length %d exceeds %d", what, n, limit)}
	}
	if s.err != nil {
		return ""
	}
	b := make([]byte, n)
	s.read(b)
	return string(b)
}

// checksum reads the CRC32C that follows what s read, from r (not
// through the checksum), and compares it.
func (s *stateReader) checksum(r io.Reader) error {
	want := s.crc.Sum32()
	if _, err := io.ReadFull(r, s.b[:4]); err != nil {
		return &StateError{Reason: "truncated before its checksum", Err: err}
	}
	if got := binary.LittleEndian.Uint32(s.b[:4]); got != want {
		return &StateError{Reason: fmt.Sprintf("checksum %#08x, contents hash to %#08x", got, want)}
	}
	return nil
}

// readHeader reads a state's magic, version and header, through the
// bucket sizes.
func readHeader(s *stateReader) (StateInfo, error) {
	version, err := readVersion(s)
	if err != nil {
		return StateInfo{}, err
	}
	return readSettings(s, version)
}

// readVersion reads a state's magic and version and checks them.
func readVersion(s *stateReader) (byte, error) {
	var magic [4]byte
	s.read(magic[:])
	version := s.byte()
	switch {
	case s.err != nil:
		return 0, s.err
	case string(magic[:]) != stateMagic:
		return 0, &StateError{Reason: fmt.Sprintf("bad magic %q, want %q", magic[:], stateMagic)}
	case version < 1 || version > stateVersion:
		return 0, &StateError{Reason: fmt.Sprintf("format version %d, this build reads versions 1 to %d", version, stateVersion)}
	}
	return version, nil
}

// readSettings reads the header after the version, through the bucket
// sizes (before version 4 Configured is Strategy).
func readSettings(s *stateReader, version byte) (StateInfo, error) {
	info := StateInfo{Version: int(version)}
	info.WorldSize, info.Rank, info.NextStep = int(s.u32()), int(s.u32()), s.u64()
	info.Spec = s.text("spec", maxSpecLen)
	info.Strategy, info.ErrorFeedback = Strategy(s.byte()), s.bool()
	info.Configured = info.Strategy
	if version >= 4 {
		info.Configured, info.MomentumMasking, info.Guard = Strategy(s.byte()), s.bool(), s.f64()
		info.Schedule = s.text("schedule", maxScheduleLen)
	}
	if version >= 5 {
		l := &info.Layout
		l.Nodes, l.LocalSize, l.Node, l.LocalRank = int(s.u32()), int(s.u32()), int(s.u32()), int(s.u32())
	}
	info.FeedbackDecay = 1
	if version >= 6 {
		info.FeedbackDecay = s.f64()
		if b := info.FeedbackDecay; s.err == nil && !(b > 0 && b <= 1 && float32(b) > 0) {
			return info, &StateError{Reason: fmt.Sprintf("feedback decay %v in the header: want (0, 1], not 0 as a float32", b)}
		}
	}
	count := s.u32()
	info.Buckets = make([]int, 0, min(count, 1<<12)) // grows only as the input holds sizes
	for i := uint32(0); i < count && s.err == nil; i++ {
		v := s.u64()
		if v > compress.MaxElements {
			return info, &StateError{Reason: fmt.Sprintf("bucket %d has %d elements, more than %d", i, v, uint64(compress.MaxElements))}
		}
		info.Buckets = append(info.Buckets, int(v))
	}
	if s.err != nil {
		return info, s.err
	}
	return info, checkPlace(info)
}

// checkPlace refuses a header whose rank has no place in its world: a
// world size of 0, a rank outside it, or (StrategyHier) a layout of
// nodes that is not the world's or does not hold the rank's place.
func checkPlace(info StateInfo) error {
	l := info.Layout
	switch {
	case info.WorldSize < 1:
		return &StateError{Reason: fmt.Sprintf("world size %d in the header: want 1 or more", info.WorldSize)}
	case info.Rank < 0 || info.Rank >= info.WorldSize: // < 0: a uint32 past int's range on 32-bit targets
		return &StateError{Reason: fmt.Sprintf("rank %d in the header is outside its world size %d", info.Rank, info.WorldSize)}
	case l == comm.Topology{}:
		return nil
	case l.Nodes < 1 || l.LocalSize < 1 || int64(l.Nodes)*int64(l.LocalSize) != int64(info.WorldSize):
		return &StateError{Reason: fmt.Sprintf("layout of %d node(s) × %d rank(s) in the header, world size %d", l.Nodes, l.LocalSize, info.WorldSize)}
	case l.Node < 0 || l.Node >= l.Nodes || l.LocalRank < 0 || l.LocalRank >= l.LocalSize:
		return &StateError{Reason: fmt.Sprintf("place node %d, local rank %d in the header is outside its layout of %d node(s) × %d rank(s)", l.Node, l.LocalRank, l.Nodes, l.LocalSize)}
	}
	return nil
}

// readGuards reads the accuracy guard's part of a state of version 3 or
// later (older versions: no flush pending): per bucket the reason of its
// pending flush, or "".
func (e *core) readGuards(version byte, s *stateReader) ([]string, error) {
	guards := make([]string, len(e.buckets))
	if version < 3 {
		return guards, nil
	}
	for i := range guards {
		n := s.u16()
		if n > maxGuardLen {
			return nil, &StateError{Reason: fmt.Sprintf("bucket %d's accuracy-guard reason has %d bytes, more than %d", i, n, maxGuardLen)}
		}
		reason := make([]byte, n)
		if !s.read(reason) {
			return nil, nil
		}
		guards[i] = string(reason)
	}
	return guards, nil
}

// readVelocity reads the momentum part of a state of version 2 or later
// (version 1: momentum 0, no velocities): the momentum and, per bucket,
// its velocity or nil. A non-finite velocity is a *StateError.
func (e *core) readVelocity(version byte, s *stateReader) (float64, [][]float32, error) {
	velocity := make([][]float32, len(e.buckets))
	if version == 1 {
		return 0, velocity, nil
	}
	momentum := s.f64()
	for i, bk := range e.buckets {
		if !s.bool() {
			continue
		}
		raw := make([]byte, 4*bk.n)
		if !s.read(raw) {
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
	Version         int // of the format
	WorldSize, Rank int
	NextStep        uint64
	Spec            string   // canonical
	Strategy        Strategy // in use: Config.Strategy resolved
	ErrorFeedback   bool
	// The settings version 4 added; before it Configured is Strategy and
	// the others are zero.
	Configured      Strategy // Config.Strategy as configured, StrategyAuto included
	MomentumMasking bool
	Guard           float64
	Schedule        string // canonical phases as FormatSchedule writes them, "" for none
	// Layout is StrategyHier's layout and this rank's place in it (version
	// 5); zero for the flat strategies and older versions.
	Layout comm.Topology
	// FeedbackDecay is the β error-feedback memory decayed by
	// (Config.FeedbackDecay, version 6), 1 for none: for FeedbackDecay
	// 0 and for older versions.
	FeedbackDecay float64
	Buckets       []int // element count per bucket
}

// InspectState reads the header of a state Save wrote, after checking its
// magic, version and checksum over all of b; it does not decode the
// error-feedback memories (Load validates those) nor check the settings
// against an engine (CheckState does). A state that fails a check is a
// *StateError.
func InspectState(b []byte) (StateInfo, error) {
	if len(b) < len(stateMagic)+1+4 {
		return StateInfo{}, &StateError{Reason: fmt.Sprintf("%d bytes, too short for an engine state", len(b))}
	}
	body := b[:len(b)-4]
	s := newStateReader(bytes.NewReader(body))
	version, err := readVersion(s)
	if err != nil {
		return StateInfo{}, err
	}
	if got, want := binary.LittleEndian.Uint32(b[len(b)-4:]), crc32.Checksum(body, castagnoli); got != want {
		return StateInfo{}, &StateError{Reason: fmt.Sprintf("checksum %#08x, contents hash to %#08x", got, want)}
	}
	return readSettings(s, version)
}

// readNested reads the state of a StrategyHier engine's engine across
// nodes from s and validates it against that engine (or, without one, as
// CheckState does, against the engine e's configuration and layout would
// build).
func (e *core) readNested(s *stateReader) (*savedState, error) {
	n := s.u64()
	if s.err == nil && n > maxNestedState {
		return nil, &StateError{Reason: fmt.Sprintf("the state across nodes has %d bytes, more than %d", n, uint64(maxNestedState))}
	}
	var blob bytes.Buffer
	if s.err == nil {
		if got, err := blob.ReadFrom(io.LimitReader(s.tee, int64(n))); err != nil || uint64(got) != n {
			return nil, &StateError{Reason: "truncated in the state across nodes", Err: cmp.Or(err, io.ErrUnexpectedEOF)}
		}
	}
	if s.err != nil {
		return nil, s.err
	}
	inner, err := e.nestedCore()
	if err != nil {
		return nil, err
	}
	st, err := inner.readState(&blob)
	if err != nil {
		return nil, &StateError{Reason: "the state across nodes", Err: err}
	}
	return st, nil
}

// nestedCore is the core of e's engine across nodes, or one configured as
// it would be (CheckState).
func (e *core) nestedCore() (*core, error) {
	if n, ok := e.be.(nester); ok {
		return n.nestedCore(), nil
	}
	l := e.layout
	shards := make([]int, len(e.buckets))
	for i, b := range e.buckets {
		shards[i] = shardLen(b.n, max(l.LocalSize, 1))
	}
	cfg := e.cfg
	cfg.Strategy = StrategyAuto
	c := &core{cfg: cfg, size: max(l.Nodes, 1), rank: l.Node}
	if err := c.configure(shards, resolve); err != nil {
		return nil, &StateError{Reason: "the engine across nodes of the saved layout", Err: err}
	}
	return c, nil
}
