package main

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/ncclcomm"
	"github.com/gradcomp/gradcomp/comm/staged"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/nccl"
	"github.com/gradcomp/gradcomp/overlap"
)

// The cores of the engine on the library's own NCCL communicator
// (gc_nccl_unique_id, gc_engine_create_nccl; ABI 2.9). The host program
// spreads a unique id (torch.distributed's store, MPI, a file); every rank
// then makes its communicator here, and from then on its buckets' path
// has no host collective: the device engine enqueues NCCL on its own
// streams, and the engine's agreement (handshake, cost model, online
// verification, reshaped loads) runs as host collectives staged through
// small device buffers (comm/staged) on a communicator of its own, split
// from the buckets' with one color, so that the two never interleave.

// ncclLib is libnccl.so.2, loaded on first use: the copy the process has
// already loaded (PyTorch's) first, else $GRADCOMP_NCCL, else the
// linker's search path (nccl.Open with this build's ncclLoadOptions). A
// failure is not kept: a later call tries again.
var ncclLib struct {
	mu  sync.Mutex
	lib *nccl.Library
}

func openNCCL() (*nccl.Library, error) {
	ncclLib.mu.Lock()
	defer ncclLib.mu.Unlock()
	if ncclLib.lib != nil {
		return ncclLib.lib, nil
	}
	opts := ncclLoadOptions
	if path := getenv(nccl.EnvPath); path != "" { // as set now, not at the process's start
		opts = append(opts[:len(opts):len(opts)], nccl.WithPath(path))
	}
	lib, err := nccl.Open(opts...)
	if err != nil {
		return nil, err
	}
	ncclLib.lib = lib
	return lib, nil
}

// ncclUniqueID is gc_nccl_unique_id's core.
func ncclUniqueID() (nccl.UniqueID, error) {
	lib, err := openNCCL()
	if err != nil {
		return nccl.UniqueID{}, err
	}
	return lib.GetUniqueID()
}

// ncclParts is what an engine on its own NCCL communicator owns besides
// its DeviceEngine.
type ncclParts struct {
	dev    overlap.Device
	mem    *stagingMemory
	dc     *ncclcomm.Comm  // the buckets' communicator
	agree  comm.DeviceComm // dc's split of one color: the staged host comm's
	host   *staged.Comm
	stream gpu.Stream // the staged host comm's
}

// close releases everything p holds, in the reverse order of its making.
func (p *ncclParts) close() error {
	var errs []error
	if p.host != nil {
		errs = append(errs, p.host.Close())
	}
	if p.stream != 0 {
		errs = append(errs, p.dev.DestroyStream(p.stream))
	}
	errs = append(errs, p.mem.close())
	if p.agree != nil {
		errs = append(errs, p.agree.Close())
	}
	if p.dc != nil {
		errs = append(errs, p.dc.Close())
	}
	return errors.Join(errs...)
}

// newNCCLEngine is gc_engine_create_nccl's core: rank of size joins the
// communicator of id on device c.device, then the engine is made over it.
// A rank whose configuration is invalid still joins and takes part in the
// handshake (overlap.Refuse), so that the others fail at once with a
// *overlap.ConfigError naming it. A rank that cannot open its device or
// NCCL makes no communicator: the others' ncclCommInitRank then ends with
// an *nccl.AbortError within the timeout.
func newNCCLEngine(id nccl.UniqueID, rank, size int, c engineConfig, sizes []int, invalid error) (e *engine, err error) {
	switch {
	case size < 1 || rank < 0 || rank >= size:
		return nil, errorf(errInvalid, "rank %d of size %d: want 0 ≤ rank < size", rank, size)
	case c.device < 0:
		return nil, errorf(errInvalid, "device %d: an engine on its own NCCL communicator needs the rank's CUDA device (cfg->device ≥ 0)", c.device)
	case id.IsZero():
		return nil, errorf(errInvalid, "the unique id is all zero: rank 0 makes it with gc_nccl_unique_id and the host spreads it")
	}
	cfg := c.Config
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = overlap.DefaultTimeout
	}
	lib, err := openNCCL()
	if err != nil {
		return nil, err
	}
	dev, bind, err := openEngineDevice(c.device)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	p := &ncclParts{dev: dev, mem: &stagingMemory{Device: dev}}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.close())
		}
	}()
	nc, err := lib.InitRank(ctx, size, id, rank, bind, nccl.WithTimeout(timeout))
	if err != nil {
		return nil, err
	}
	p.dc = ncclcomm.Wrap(nc)
	sctx, cancel := context.WithTimeout(ctx, timeout)
	p.agree, err = p.dc.Split(sctx, 0, rank)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("the engine's agreement communicator (a split of one color): %w", err)
	}
	if p.stream, err = dev.NewStream(); err != nil {
		return nil, err
	}
	p.host = staged.New(p.agree, p.mem, p.stream, c.topo)
	e = &engine{sizes: sizes, nccl: p}
	undo := useWorkers(c.Workers)
	if invalid != nil {
		err = overlap.Refuse(ctx, p.host, cfg.Timeout, invalid)
	} else {
		e.device, err = overlap.NewDevice(ctx, dev, p.dc, p.host, sizes, cfg)
	}
	if err != nil {
		undo()
		return nil, err
	}
	return e, nil
}

// stagingMemory is a Device as comm/staged's memory: a stream is synced
// when an event recorded on it after its work has completed. Synced
// records the event when no record is pending and then only queries it
// until it has completed, so that polling does not keep moving the mark.
type stagingMemory struct {
	overlap.Device // its memory calls serve as they are
	mu             sync.Mutex
	ev             gpu.Event  // made on first use, destroyed by close
	pending        gpu.Stream // the stream the pending record is on
	armed          bool       // a record is pending
}

// Synced reports whether s has run the work enqueued on it before the
// first call of this wait (each true answer ends a wait).
func (m *stagingMemory) Synced(s gpu.Stream) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ev == 0 {
		ev, err := m.NewEvent(false)
		if err != nil {
			return false, err
		}
		m.ev = ev
	}
	if !m.armed || m.pending != s {
		if err := m.Record(m.ev, s); err != nil {
			return false, err
		}
		m.armed, m.pending = true, s
	}
	done, err := m.EventQuery(m.ev)
	if done || err != nil {
		m.armed = false
	}
	return done, err
}

// close destroys the event.
func (m *stagingMemory) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ev == 0 {
		return nil
	}
	err := m.DestroyEvent(m.ev)
	m.ev = 0
	return err
}
