package fakegpu

import (
	"errors"
	"sync/atomic"

	"github.com/gradcomp/gradcomp/gpu"
)

// hooked is the platform whose devices the mock NCCL's hooks reach
// (AttachNCCL's).
var hooked atomic.Pointer[Platform]

// launchHook is the mock NCCL's launch hook: fn on stream s of device
// ordinal of the hooked platform (0: that device's default stream), after
// the work already on it. A stream of another device is refused.
func launchHook(s gpu.Stream, ordinal int, fn func()) error {
	p := hooked.Load()
	if p == nil {
		return errors.New("fakegpu: no platform is attached to the mock NCCL")
	}
	d, err := p.lookup(ordinal)
	if err != nil {
		return err
	}
	return d.LaunchHostFunc(s, fn)
}
