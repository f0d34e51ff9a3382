package overlap

import (
	"sync"

	"github.com/gradcomp/gradcomp/internal/workq"
)

// stream is the CPU stand-in for a CUDA stream: work enqueued on it runs in
// order on one goroutine. Like a CUDA stream it is driven from the host by
// three calls that never block: enqueue (a kernel launch), record
// (cudaEventRecord) and waitEvent (cudaStreamWaitEvent); the host blocks
// only on an event (cudaEventSynchronize). The engine uses nothing else, so
// CUDA streams and events can replace this type without changing it.
//
// Unlike CUDA, waiting on an event that is never recorded would block the
// stream forever; the engine records every event before any stream waits on
// it, which is also what CUDA requires for the wait to mean anything.
type stream struct{ q *workq.Queue }

func newStream() *stream { return &stream{workq.New()} }

// enqueue appends fn to the stream's work. It never blocks. Work enqueued
// after close is dropped.
func (s *stream) enqueue(fn func()) { s.q.Enqueue(fn) }

// record returns an event that fires once every piece of work enqueued so
// far has run.
func (s *stream) record() *event {
	ev := newEvent()
	s.enqueue(ev.fire)
	return ev
}

// waitEvent makes work enqueued from now on wait until ev fires.
func (s *stream) waitEvent(ev *event) {
	s.enqueue(func() { <-ev.ch })
}

// close lets the queued work run, then ends the goroutine, and waits for it.
func (s *stream) close() {
	s.q.Close()
	<-s.q.Done()
}

// event is a point in a stream's work (cudaEvent_t).
type event struct {
	once sync.Once
	ch   chan struct{}
}

func newEvent() *event { return &event{ch: make(chan struct{})} }

func (e *event) fire() { e.once.Do(func() { close(e.ch) }) }

// fired returns a channel closed when the event fires.
func (e *event) fired() <-chan struct{} { return e.ch }
