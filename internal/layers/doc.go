// Package layers holds no code: its test keeps gradcomp's imports pointing
// down, in the order docs/DESIGN.md ("Layers and packages") gives. Each
// package of the lower layers may import only the gradcomp packages listed
// for it in the test; what drives an engine (plugin, train, netbench,
// cmd/gradcomp) sits above and is not listed.
package layers
