package overlap

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinels for misuse, matched with errors.Is through a *UsageError.
var (
	ErrNoStep        = errors.New("no step in flight")
	ErrStepInFlight  = errors.New("a step is in flight")
	ErrUnknownBucket = errors.New("unknown bucket")
	ErrAlreadyReady  = errors.New("bucket already ready")
	ErrNotReady      = errors.New("buckets not ready")
	ErrWaiting       = errors.New("Wait has been called for this step")
	ErrEngineClosed  = errors.New("engine closed")
	ErrLength        = errors.New("gradient length differs from the bucket size")
	ErrNotDelegable  = errors.New("the bucket's exchange is the engine's this step")
	ErrNotDelegated  = errors.New("the bucket was not delegated this step")
)

// UsageError reports a call the engine's state does not allow (Ready of an
// unknown or already ready bucket, Wait without Step, Step while a step is
// in flight, any call after Close). Nothing happened. errors.Is matches Err.
type UsageError struct {
	Call   string // e.g. "Ready(7)"
	Err    error  // one of the sentinels above
	Detail string // the values involved
}

func (e *UsageError) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("overlap: %s: %v", e.Call, e.Err)
	}
	return fmt.Sprintf("overlap: %s: %v: %s", e.Call, e.Err, e.Detail)
}

func (e *UsageError) Unwrap() error { return e.Err }

// ConfigError reports an invalid configuration: this rank's own (Rank is
// this rank, Err its error), or, from the handshake, another rank's (Err
// nil: only the reason crossed the wire), so that every rank fails and
// none waits for the others. CheckState reports a configuration it cannot
// check a state against with Rank -1 (no rank is concerned).
type ConfigError struct {
	Rank   int
	Reason string
	Err    error
}

func (e *ConfigError) Error() string {
	if e.Rank < 0 {
		return "overlap: invalid configuration: " + e.Reason
	}
	return fmt.Sprintf("overlap: rank %d has an invalid configuration: %s", e.Rank, e.Reason)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// ConfigMismatchError reports ranks whose configurations differ, found by
// the handshake in New. Every rank gets the same error: the first field, in
// handshake order, on which the lowest such rank differs from rank 0.
type ConfigMismatchError struct {
	Field      string // e.g. "spec", "buckets", "bucket 3 elements"
	Rank       int
	Value      string // Rank's value
	OtherRank  int    // always 0
	OtherValue string
}

func (e *ConfigMismatchError) Error() string {
	return fmt.Sprintf("overlap: ranks disagree on %s: rank %d has %s, rank %d has %s",
		e.Field, e.Rank, e.Value, e.OtherRank, e.OtherValue)
}

// TopologyError reports ranks whose topologies (comm.Topology) do not
// describe one layout of nodes, found by New for StrategyHier after the
// handshake. Every rank gets the same error.
type TopologyError struct {
	Reason string // which rank breaks which rule (comm.CheckTopologies)
}

func (e *TopologyError) Error() string { return "overlap: ranks disagree on the topology: " + e.Reason }

// StepError reports a step that failed on this rank: a collective that
// failed or timed out (a dead peer), a payload that did not decode, a
// context that ended. It wraps the cause. After it, the engine is broken
// (see BrokenError): the ranks may be out of step.
type StepError struct {
	Step   uint64
	Bucket int    // -1 when the failure is not a bucket's
	Stage  string // what was running, e.g. "sra AllToAll", "Wait"
	Err    error
}

func (e *StepError) Error() string {
	if e.Bucket < 0 {
		return fmt.Sprintf("overlap: step %d: %s: %v", e.Step, e.Stage, e.Err)
	}
	return fmt.Sprintf("overlap: step %d, bucket %d: %s: %v", e.Step, e.Bucket, e.Stage, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

// BrokenError is returned by every call after a step failed with a
// StepError: build a new engine over a new Comm.
type BrokenError struct {
	Cause error
}

func (e *BrokenError) Error() string {
	return fmt.Sprintf("overlap: engine unusable after a failed step: %v", e.Cause)
}

func (e *BrokenError) Unwrap() error { return e.Cause }

// NonFiniteStepError reports a step that failed because a gradient held NaN or
// Inf, with Config.FailOnNonFinite. Every rank gets it for the same
// buckets; the engine stays usable and the step is skipped: every rank's
// error-feedback memory and momentum velocity are as before it (see the
// package doc). Skip the optimizer step.
type NonFiniteStepError struct {
	Step    uint64
	Buckets []int    // ascending
	Details []string // per bucket: who had what
}

func (e *NonFiniteStepError) Error() string {
	parts := make([]string, len(e.Buckets))
	for i, b := range e.Buckets {
		parts[i] = fmt.Sprintf("bucket %d (%s)", b, e.Details[i])
	}
	return fmt.Sprintf("overlap: step %d: non-finite gradient values in %s", e.Step, strings.Join(parts, ", "))
}

// StateError reports a saved engine state Load (or CheckState) cannot
// accept. The engine is unchanged.
type StateError struct {
	Reason string
	// Setting names the setting on which a well-formed state differs from
	// the engine (e.g. "spec", "strategy", "schedule"), Saved and Current
	// its value in the state and in the engine; all "" otherwise.
	Setting, Saved, Current string
	Err                     error // the underlying error, if any
}

func (e *StateError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("overlap: bad engine state: %s: %v", e.Reason, e.Err)
	}
	return "overlap: bad engine state: " + e.Reason
}

func (e *StateError) Unwrap() error { return e.Err }
