package overlap

import "sync"

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
type stream struct {
	mu     sync.Mutex
	queue  []func()
	wake   chan struct{} // one pending wake-up
	closed bool
	done   chan struct{} // closed when the goroutine ends
}

func newStream() *stream {
	s := &stream{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *stream) loop() {
	defer close(s.done)
	for {
		s.mu.Lock()
		q := s.queue
		s.queue = nil
		closed := s.closed
		s.mu.Unlock()
		for _, fn := range q {
			fn()
		}
		if len(q) == 0 {
			if closed {
				return
			}
			<-s.wake
		}
	}
}

// enqueue appends fn to the stream's work. It never blocks. Work enqueued
// after close is dropped.
func (s *stream) enqueue(fn func()) {
	s.mu.Lock()
	if !s.closed {
		s.queue = append(s.queue, fn)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

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
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	<-s.done
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
