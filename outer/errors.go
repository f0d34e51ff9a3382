package outer

import (
	"errors"
	"fmt"

	"github.com/gradcomp/gradcomp/overlap"
)

// ErrClosed is wrapped by the error of Step, Save and Load after Close.
var ErrClosed = errors.New("loop closed")

// ConfigError reports an invalid configuration or parameter list given to
// New: this rank's own, or, found by the handshake, another rank's, so that
// every rank fails at once instead of waiting for the others.
type ConfigError struct {
	Rank   int    // the rank whose configuration is invalid
	Field  string // the Config field at fault, e.g. "Delay", "FragmentOf[3]", "Optimizer.LR"; "params" for New's parameters
	Reason string // the values involved and what is wanted
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("outer: rank %d: invalid %s: %s", e.Rank, e.Field, e.Reason)
}

// ConfigMismatchError reports ranks whose configurations differ, found by
// New's handshake. Every rank gets the same error: the first field, in
// handshake order, on which the lowest rank that differs from rank 0
// differs. (The engines' settings — codec, strategy, error feedback — are
// compared by each fragment engine's own handshake, which reports an
// *overlap.ConfigMismatchError.)
type ConfigMismatchError struct {
	Field      string // e.g. "SyncEvery", "Optimizer", "tensor 3 elements"
	Rank       int
	Value      string // Rank's value
	OtherRank  int    // always 0
	OtherValue string
}

func (e *ConfigMismatchError) Error() string {
	return fmt.Sprintf("outer: ranks disagree on %s: rank %d has %s, rank %d has %s",
		e.Field, e.Rank, e.Value, e.OtherRank, e.OtherValue)
}

// StateError reports a saved state Load cannot accept. The Loop is
// unchanged.
type StateError struct {
	Reason string
	// Field names the setting on which a well-formed state differs from
	// the Loop (e.g. "SyncEvery", "tensor 2 elements"), Saved and Current
	// its value in the state and in the Loop; all "" otherwise.
	Field, Saved, Current string
	Err                   error // the underlying error (an *overlap.StateError for a fragment engine's state), if any
}

func (e *StateError) Error() string {
	msg := "outer: bad state: " + e.Reason
	if e.Field != "" {
		msg = fmt.Sprintf("outer: bad state: %s is %s in the state, %s in this loop", e.Field, e.Saved, e.Current)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *StateError) Unwrap() error { return e.Err }

// BrokenError is returned by every call after an outer exchange failed (a
// dead or stalled peer, an ended context) or a Load failed after it began
// replacing the state: the ranks may be out of step. Build a new Loop over
// a new Comm and resume from a checkpoint.
type BrokenError struct {
	Cause error
}

func (e *BrokenError) Error() string {
	return fmt.Sprintf("outer: loop unusable after a failure: %v", e.Cause)
}

func (e *BrokenError) Unwrap() error { return e.Cause }

// NonFiniteSyncError reports a sync whose averaged pseudo-gradient was not
// finite: some rank's Δ held NaN or Inf (or the average overflowed). Every
// rank gets it for the same sync, and the sync is skipped on every rank:
// the fragment's global weights, outer momentum and local weights stay as
// they were, and so does its engine's error-feedback memory. With
// OnNonFinite SkipNonFinite it is reported in Sync.Skipped; with
// FailNonFinite Step also returns it.
type NonFiniteSyncError struct {
	Fragment int
	Started  uint64                      // the inner step the sync started at
	Err      *overlap.NonFiniteStepError // the engine's: which buckets, who had what
}

func (e *NonFiniteSyncError) Error() string {
	return fmt.Sprintf("outer: fragment %d's sync of step %d skipped: %v", e.Fragment, e.Started, e.Err)
}

func (e *NonFiniteSyncError) Unwrap() error { return e.Err }
