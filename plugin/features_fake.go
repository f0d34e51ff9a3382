//go:build fakegpu

package main

// features is gc_features' value in the fake-device build: its engine's
// devices are fake (enginedev_fake.go); the compressor's device calls
// have no CUDA.
const features = featureFakeDevice
