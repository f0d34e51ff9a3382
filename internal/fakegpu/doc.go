// Package fakegpu is a GPU in host memory, for tests and for the test build
// of the plugin: Platforms of fake devices, each with every method of
// overlap.Device (memory, streams, events, and the kernels of package
// kernels computed by the CPU reference codecs), a comm.DeviceComm over a
// host comm.Comm (Comm), and the hooks through which the mock libnccl.so.2
// runs its collectives in a fake device's stream order (AttachNCCL, in
// cgo builds).
//
// # Memory
//
// A device pointer is a real host address: Alloc maps memory outside the
// Go heap, so C code (the mock NCCL) can read and write it. Every fake
// device of the process knows every allocation, and an access is checked
// when it runs: a pointer inside an allocation of another fake device is
// an error naming both devices; an access that runs past the end of its
// allocation is an error. A pointer that no fake device allocated is
// external host memory and is accepted as it is: the plugin's test mode
// passes the host addresses of PyTorch CPU tensors as device pointers.
//
// # Streams and events
//
// Streams and events follow CUDA: each device has a default stream with
// handle 0; NewStream and NewEvent handles are unique in the process; a
// stream or event of another device is refused at the call, except that a
// stream may wait for an event of any device (as CUDA allows); a wait for
// an event never recorded is a no-op, and Record captures the work
// enqueued on the stream so far. A stream runs its work in order on a
// goroutine of its own, so host work on it (LaunchHostFunc) may block,
// which holds back that stream only. Unlike CUDA's legacy default stream,
// stream 0 does not synchronize with the device's other streams.
//
// # Errors
//
// A call that is refused returns its error and enqueues nothing. Work that
// fails while it runs (an access out of bounds, on another device's
// memory) makes the device's sticky error, as CUDA's: every later call on
// the device, EventQuery included, returns it, and the device's streams
// skip their remaining work (their events still complete, so no stream of
// another device waits forever).
//
// # Threads
//
// Like CUDA's per-thread current context, a device may be current on an OS
// thread (Bind, Current); the mock NCCL asks which device the thread that
// initializes a communicator has current.
package fakegpu
