// Package workq runs functions in order on a goroutine of their own: the
// CPU stand-in for a CUDA stream, under overlap's host engine's streams
// and fakegpu's.
package workq

import "sync"

// Queue runs the functions enqueued on it in order on one goroutine.
type Queue struct {
	mu     sync.Mutex
	queue  []func()
	wake   chan struct{} // one pending wake-up
	closed bool
	done   chan struct{} // closed when the goroutine ends
}

// New starts a queue.
func New() *Queue {
	q := &Queue{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go q.loop()
	return q
}

func (q *Queue) loop() {
	defer close(q.done)
	for {
		q.mu.Lock()
		work, closed := q.queue, q.closed
		q.queue = nil
		q.mu.Unlock()
		for _, fn := range work {
			fn()
		}
		if len(work) == 0 {
			if closed {
				return
			}
			<-q.wake
		}
	}
}

// Enqueue appends fn to the queue's work. It never blocks. Work enqueued
// after Close is dropped.
func (q *Queue) Enqueue(fn func()) {
	q.mu.Lock()
	if !q.closed {
		q.queue = append(q.queue, fn)
	}
	q.mu.Unlock()
	q.poke()
}

// Close lets the work enqueued so far run, then ends the goroutine; it
// does not wait (Done does).
func (q *Queue) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.poke()
}

// Done returns a channel closed when the goroutine has ended.
func (q *Queue) Done() <-chan struct{} { return q.done }

func (q *Queue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}
