//go:build fakegpu

package main

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/gradcomp/gradcomp/internal/fakegpu"
	"github.com/gradcomp/gradcomp/nccl"
	"github.com/gradcomp/gradcomp/overlap"
)

// The fake-device build, libgradcomp_fake.so (-tags fakegpu): a TEST
// build in which the device engine runs on internal/fakegpu (host memory,
// the CPU codecs as kernels, CUDA's stream and event rules enforced) and
// its communicator is the mock libnccl.so.2 (internal/ncclmock), whose
// collectives run in the fake devices' stream order through the hooks
// fakegpu installs. The host program passes host addresses (PyTorch CPU
// tensors) as device pointers and 0 (a device's default stream) as its
// stream. It exists so that the CUDA path of the engine, the C ABI and
// the Python hooks run end to end on machines without a GPU; it is never
// for training.

// ncclLoadOptions are openNCCL's: the mock named by $GRADCOMP_NCCL, even
// where PyTorch has loaded the real libnccl.so.2 (which cannot run
// without a GPU), beside it.
var ncclLoadOptions = []nccl.LoadOption{nccl.IgnoreLoaded()}

// envFakeDevices names the number of fake devices (default 8).
const envFakeDevices = "GRADCOMP_FAKE_DEVICES"

// fakePlatform is the process's fake devices, made on first use.
var fakePlatform = sync.OnceValues(func() (*fakegpu.Platform, error) {
	n := 8
	if v := getenv(envFakeDevices); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > 1024 {
			return nil, errorf(errInvalid, "$%s = %q: want a count of fake devices from 1 to 1024", envFakeDevices, v)
		}
	}
	return fakegpu.New(n), nil
})

// attached records that the mock NCCL runs on fakePlatform's streams.
var attached struct {
	sync.Mutex
	done bool
}

// openEngineDevice returns fake device ordinal and the option that makes
// it current on NCCL's init thread, after attaching the platform to the
// loaded libnccl.so.2, which must be the mock.
func openEngineDevice(ordinal int) (overlap.Device, nccl.Option, error) {
	p, err := fakePlatform()
	if err != nil {
		return nil, nil, err
	}
	if ordinal >= p.Len() {
		return nil, nil, errorf(errNoDevice, "no fake device %d: this process has %d (set $%s)", ordinal, p.Len(), envFakeDevices)
	}
	if err := attachMock(p); err != nil {
		return nil, nil, err
	}
	d := p.Device(ordinal)
	return d, nccl.WithDeviceBinder(ordinal, func() error { d.Bind(); return nil }), nil
}

// attachMock installs p's devices as the mock NCCL's, once.
func attachMock(p *fakegpu.Platform) error {
	attached.Lock()
	defer attached.Unlock()
	if attached.done {
		return nil
	}
	lib, err := openNCCL()
	if err != nil {
		return err
	}
	set, ok := lib.Symbol("gcmock_set_device_hooks")
	if !ok {
		return errorf(errNCCL, "libgradcomp_fake.so runs on the mock libnccl.so.2 (make mocknccl; $GRADCOMP_NCCL names it), but %s has no gcmock_set_device_hooks", lib.Path())
	}
	if err := p.AttachNCCL(set); err != nil {
		return fmt.Errorf("attaching the fake devices to the mock NCCL: %w", err)
	}
	attached.done = true
	return nil
}
