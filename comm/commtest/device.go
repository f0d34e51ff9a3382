package commtest

import (
	"context"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/staged"
	"github.com/gradcomp/gradcomp/gpu"
)

// Memory is the device memory a DeviceComm under test works on
// (staged.Memory): a real GPU's is the CUDA driver's; a mock NCCL's is
// host memory.
type Memory = staged.Memory

// RunDevice is Run for a comm.DeviceComm: the same collectives, lengths
// and checks, each staged through device buffers of mem on stream s
// (comm/staged). Barrier, which a DeviceComm lacks, is an AllReduce of
// one element. It is collective, like Run.
func RunDevice(ctx context.Context, dc comm.DeviceComm, mem Memory, s gpu.Stream, o Options) error {
	c := staged.New(dc, mem, s, comm.Topology{})
	defer c.Close()
	return Run(ctx, c, o)
}
