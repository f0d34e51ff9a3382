package overlap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/kernels"
)

// conclude reads the averages' statuses into the runs' outcomes, and the
// stage times from the events; a delegated run has neither (Delegate set
// its outcome and statistics).
func (e *DeviceEngine) conclude(st *step) error {
	statuses := make([]byte, kernels.StatusLen*len(st.runs))
	if err := e.dev.CopyOut(e.dec, statuses, e.statuses); err != nil {
		return &StepError{Step: st.num, Bucket: -1, Stage: "reading statuses", Err: err}
	}
	var guards []byte
	if e.cfg.Guard > 0 {
		guards = make([]byte, kernels.GuardLen*len(st.runs))
		if err := e.dev.CopyOut(e.dec, guards, e.guards); err != nil {
			return &StepError{Step: st.num, Bucket: -1, Stage: "reading the accuracy guard's measures", Err: err}
		}
	}
	var momentum []byte
	if e.cfg.Momentum != 0 {
		momentum = make([]byte, kernels.StatusLen*len(st.runs))
		if err := e.dev.CopyOut(e.enc, momentum, e.momStatuses); err != nil {
			return &StepError{Step: st.num, Bucket: -1, Stage: "reading momentum statuses", Err: err}
		}
	}
	measured := e.measured(st)
	for i, r := range st.runs {
		if r.delegated {
			continue
		}
		b, s := e.bufs[i], &r.stats
		if momentum != nil {
			r.momFinite = kernels.StatusError(momentum[kernels.StatusLen*i:kernels.StatusLen*(i+1)]) == nil
		}
		fallback, err := e.nonFinite(r, statuses[kernels.StatusLen*i:kernels.StatusLen*(i+1)])
		if err != nil {
			return &StepError{Step: st.num, Bucket: i, Stage: "reading statuses", Err: err}
		}
		r.outcome = pathDense
		if r.compressed {
			r.outcome = pathCompressed
		}
		if fallback != "" {
			r.nonFinite, r.fallback = true, fallback
			if e.cfg.FailOnNonFinite {
				r.outcome = pathSkipped
			}
		} else if guards != nil && r.compressed {
			r.heldBack = math.Float64frombits(binary.LittleEndian.Uint64(guards[kernels.GuardLen*i:]))
		}
		for _, t := range []struct {
			d          *time.Duration
			start, end gpu.Event
		}{{&s.Compress, b.encBeg, b.encEnd}, {&s.Exchange, b.xBeg, b.xEnd}, {&s.Decompress, b.decBeg, b.decEnd}} {
			if *t.d, err = e.dev.Elapsed(t.start, t.end); err != nil {
				return &StepError{Step: st.num, Bucket: i, Stage: "timing events", Err: err}
			}
		}
		if measured {
			// Verification's times, from the first bucket's encode start
			// (a measured step delegates none).
			from, err := e.dev.Elapsed(e.bufs[0].encBeg, b.encBeg)
			if err == nil {
				var to time.Duration
				to, err = e.dev.Elapsed(e.bufs[0].encBeg, b.decEnd)
				r.readyAt, r.doneAt = st.start.Add(from), st.start.Add(to)
			}
			if err != nil {
				return &StepError{Step: st.num, Bucket: i, Stage: "timing events", Err: err}
			}
		}
		for _, v := range e.path(r).volumes(r.b) {
			s.BytesSent += v
		}
	}
	return nil
}

// settle installs, after a step delivered, the residuals Encode
// wrote for its compressed, finite buckets (and low-rank's next warm
// start Q̄), the zeroed stage-1 residuals
// of its finite flushes (the accuracy guard's, written by kernels.Flush)
// and the momentum velocities m·u + g that are finite (swaps); a step
// that failed or was skipped leaves every memory and velocity as it was.
func (e *DeviceEngine) settle(st *step, how stepEnd) {
	if how != stepDelivered {
		return
	}
	for _, r := range st.runs {
		b := e.bufs[r.b.idx]
		if r.momFinite {
			b.mom, b.next = b.next, b.mom
		}
		switch {
		case (e.cfg.ErrorFeedback || e.lowRank != nil) && r.outcome == pathCompressed && !r.nonFinite:
			// Low-rank's warm start Q̄ moves on without error feedback too.
			b.resid.Commit()
			b.resid2.Commit()
		case r.flush && r.outcome == pathDense && !r.nonFinite:
			b.resid.Commit()
		}
	}
}

// nonFinite reads run r's average status (kernels.Average's Out) and
// returns what went wrong this step, or "".
func (e *DeviceEngine) nonFinite(r *run, status []byte) (string, error) {
	if binary.LittleEndian.Uint64(status[8:]) != math.MaxUint64 {
		// A failed exchange: only a compressed one has statuses (the
		// dense average gathers none).
		return e.x.failures(r)
	}
	clean := make([]byte, kernels.StatusLen)
	for i := range clean {
		clean[i] = 0xff
	}
	copy(clean, status[:8])
	if err := kernels.StatusError(clean); err != nil {
		var nfe *compress.NonFiniteError
		if errors.As(err, &nfe) {
			return fmt.Sprintf("the average holds %v at element %d (a rank's gradient held NaN or Inf, or the sum overflowed)", nfe.Value, nfe.Index), nil
		}
		return err.Error(), nil
	}
	return "", nil
}

// velocity copies bucket i's momentum velocity from the device (which
// waits for the encode stream).
func (e *DeviceEngine) velocity(i int) ([]float32, error) {
	b := e.bufs[i]
	if !b.velocity {
		return nil, nil
	}
	u := make([]float32, e.buckets[i].n)
	if err := e.dev.CopyOut(e.enc, f32.Bytes(u), b.mom); err != nil {
		return nil, fmt.Errorf("reading it from the device: %w", err)
	}
	return u, nil
}

// setVelocity copies velocities Load validated to the device (zeros for
// nil), ordered before the next step's momentum correction. Without
// momentum correction there are none (Load checked the momentum).
func (e *DeviceEngine) setVelocity(us [][]float32) error {
	if e.cfg.Momentum == 0 {
		return nil
	}
	for i, u := range us {
		b := e.bufs[i]
		raw := make([]byte, 4*e.buckets[i].n)
		if u != nil {
			raw = f32.Bytes(u)
		}
		if err := e.dev.CopyIn(e.enc, b.mom, raw); err != nil {
			return fmt.Errorf("overlap: Load on rank %d: writing bucket %d's momentum velocity to the device: %w", e.rank, i, err)
		}
		b.velocity = u != nil
	}
	return nil
}
