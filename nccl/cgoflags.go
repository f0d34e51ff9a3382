//go:build cgo

package nccl

// The package links against nothing from NCCL or CUDA: libnccl.so.2 is
// opened at run time with dlopen. -ldl is needed on glibc before 2.34 and
// harmless after. These flags apply to every cgo file of the package.

// #cgo LDFLAGS: -ldl
import "C"
