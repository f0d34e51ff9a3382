// Package train is gradcomp's data-parallel training demo: a small real
// model trained by N ranks that average their gradients through the overlap
// engine, to compare compression schemes by what they do to accuracy, bytes
// on the wire and step time.
//
// The model is an MLP (see MLP) with hand-written forward and backward
// passes, classifying 8×8 images of digits generated deterministically from
// stroke templates with random affine jitter, clutter and noise (see
// Digits). Each rank trains on its own shard of every global batch; backward
// hands each gradient bucket to the Exchanger as soon as its layers are
// done, so the exchange of the last layers overlaps backward through the
// first; Wait returns the averages and every rank takes the same SGD step.
//
// Compare runs several schemes one after the other, on every rank of an
// in-process group (comm/inproc) or on this process's rank of an MPI job
// (comm/mpi); RunRank is one rank's run of one scheme. The report functions
// write the table, CSV, JSON and the PNG curves.
package train
