package fakegpu

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
)

// registry indexes the objects of every fake device of the process: the
// allocations by address (they are real host addresses, so they never
// collide) and the streams and events by handle (unique in the process).
type registry struct {
	mu      sync.Mutex
	allocs  []*allocation   // sorted by base
	handles map[uintptr]any // *stream or *event
	next    uintptr         // the last handle given
}

// firstHandle keeps handles clear of 0 (the default stream) and of CUDA's
// special stream handles 1 and 2 (cudaStreamLegacy, cudaStreamPerThread).
const firstHandle = 0x1000

var reg = registry{handles: map[uintptr]any{}, next: firstHandle}

// handle registers obj under a new handle and returns it.
func (r *registry) handle(obj any) uintptr {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next += 0x10
	r.handles[r.next] = obj
	return r.next
}

// object returns the object of handle h, or nil.
func (r *registry) object(h uintptr) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.handles[h]
}

// drop forgets handle h.
func (r *registry) drop(h uintptr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.handles, h)
}

// add registers an allocation.
func (r *registry) add(a *allocation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, _ := slices.BinarySearchFunc(r.allocs, a.base, byBase)
	r.allocs = slices.Insert(r.allocs, i, a)
}

// remove unregisters the allocation at base and returns it, or nil.
func (r *registry) remove(base uintptr) *allocation {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := slices.BinarySearchFunc(r.allocs, base, byBase)
	if !ok {
		return nil
	}
	a := r.allocs[i]
	r.allocs = slices.Delete(r.allocs, i, i+1)
	return a
}

// locate returns the allocation holding address p, or nil, and the first
// allocation above p, or nil.
func (r *registry) locate(p uintptr) (in, next *allocation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := slices.BinarySearchFunc(r.allocs, p, byBase)
	if ok {
		in, i = r.allocs[i], i+1
	} else if i > 0 && p < r.allocs[i-1].base+uintptr(r.allocs[i-1].size) {
		in = r.allocs[i-1]
	}
	if i < len(r.allocs) {
		next = r.allocs[i]
	}
	return in, next
}

// check is the rule for n > 0 bytes at p used on d: inside an allocation
// of d and within it, or outside every allocation (external host memory).
func (r *registry) check(d *Device, p uintptr, n int) error {
	in, next := r.locate(p)
	switch {
	case in == nil && next != nil && p+uintptr(n) > next.base:
		return fmt.Errorf("%d bytes at %#x run into the allocation at %#x of %s", n, p, next.base, next.dev)
	case in == nil:
		return nil
	case in.dev != d:
		return d.foreign("pointer", p, in.dev)
	case p+uintptr(n) > in.base+uintptr(in.size):
		return fmt.Errorf("%d bytes at %#x run %d bytes past the end of the %d-byte allocation at %#x on %s",
			n, p, p+uintptr(n)-in.base-uintptr(in.size), in.size, in.base, d)
	}
	return nil
}

// count returns what d holds.
func (r *registry) count(d *Device) Resources {
	r.mu.Lock()
	defer r.mu.Unlock()
	var res Resources
	for _, a := range r.allocs {
		if a.dev == d {
			res.Allocations++
		}
	}
	for _, obj := range r.handles {
		if owner(obj) != d {
			continue
		}
		if _, ok := obj.(*stream); ok {
			res.Streams++
		} else {
			res.Events++
		}
	}
	return res
}

// release unregisters every allocation, stream and event of p's devices
// and returns them.
func (r *registry) release(p *Platform) []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	var objs []any
	r.allocs = slices.DeleteFunc(r.allocs, func(a *allocation) bool {
		if a.dev.plat == p {
			objs = append(objs, a)
			return true
		}
		return false
	})
	for h, obj := range r.handles {
		if owner(obj).plat == p {
			objs = append(objs, obj)
			delete(r.handles, h)
		}
	}
	return objs
}

// byBase orders allocations by their base address.
func byBase(a *allocation, p uintptr) int { return cmp.Compare(a.base, p) }

// owner returns the device of a stream or an event.
func owner(obj any) *Device {
	switch o := obj.(type) {
	case *stream:
		return o.dev
	case *event:
		return o.dev
	}
	panic(fmt.Sprintf("fakegpu: registry holds a %T", obj))
}

// streams returns the streams NewStream made on d and not destroyed.
func (r *registry) streams(d *Device) []*stream {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ss []*stream
	for _, obj := range r.handles {
		if s, ok := obj.(*stream); ok && s.dev == d {
			ss = append(ss, s)
		}
	}
	return ss
}
