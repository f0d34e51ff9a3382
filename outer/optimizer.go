package outer

import (
	"fmt"
	"math"
	"strconv"
)

// OptimizerKind is the outer optimizer's rule (Optimizer.Kind).
type OptimizerKind int

// The outer optimizers. With Δ̄ the averaged pseudo-gradient of an
// element, θ its global weight and m its momentum:
const (
	// Nesterov is torch.optim.SGD(nesterov=True, dampening=0):
	// m ← μ·m + Δ̄; θ ← θ − lr·(Δ̄ + μ·m). DiLoCo's outer optimizer.
	Nesterov OptimizerKind = iota
	// SGD is θ ← θ − lr·Δ̄ (SparseLoCo's, whose error feedback takes the
	// place of momentum).
	SGD
	// None averages the models: θ ← θ − Δ̄, the mean of the ranks' local
	// weights (FedAvg).
	None
)

// OptimizerKinds returns every OptimizerKind, in value order (a front
// end's list of the names String gives).
func OptimizerKinds() []OptimizerKind { return []OptimizerKind{Nesterov, SGD, None} }

// String returns the kind's name: "nesterov", "sgd", "none", or
// "OptimizerKind(N)".
func (k OptimizerKind) String() string {
	switch k {
	case Nesterov:
		return "nesterov"
	case SGD:
		return "sgd"
	case None:
		return "none"
	}
	return fmt.Sprintf("OptimizerKind(%d)", int(k))
}

// Optimizer is the outer optimizer, applied to a fragment's global weights
// when its average arrives. Every operation is a float32 one, rounded on
// its own (no fused multiply-add), so every rank and every architecture
// computes the same bits.
type Optimizer struct {
	Kind OptimizerKind
	// LR is the learning rate: Nesterov's (0: 0.7) and SGD's (> 0, no
	// default); None takes none (0).
	LR float64
	// Momentum is Nesterov's μ in (0, 1) (0 means 0.9: μ 0 would be
	// SGD's rule); SGD and None take none (0).
	Momentum float64
}

// The defaults of Optimizer's zero value: DiLoCo's outer Nesterov.
const (
	DefaultLR       = 0.7
	DefaultMomentum = 0.9
)

// String writes the optimizer as the handshake compares it, e.g.
// "nesterov lr=0.7 momentum=0.9".
func (o Optimizer) String() string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	switch o.Kind {
	case Nesterov:
		return fmt.Sprintf("%v lr=%s momentum=%s", o.Kind, f(o.LR), f(o.Momentum))
	case SGD:
		return fmt.Sprintf("%v lr=%s", o.Kind, f(o.LR))
	}
	return o.Kind.String()
}

// resolve fills in Nesterov's defaults and checks o: a *ConfigError
// naming the field (its Rank left for the caller).
func (o Optimizer) resolve() (Optimizer, *ConfigError) {
	bad := func(field, format string, args ...any) (Optimizer, *ConfigError) {
		return o, &ConfigError{Field: "Optimizer." + field, Reason: fmt.Sprintf(format, args...)}
	}
	switch o.Kind {
	case Nesterov:
		if o.LR == 0 {
			o.LR = DefaultLR
		}
		if o.Momentum == 0 {
			o.Momentum = DefaultMomentum
		}
		if !(o.Momentum > 0 && o.Momentum < 1) {
			return bad("Momentum", "%v: want 0 < Momentum < 1 (0: %v)", o.Momentum, DefaultMomentum)
		}
	case SGD:
		if o.Momentum != 0 {
			return bad("Momentum", "%v with kind sgd: plain SGD has no momentum (use nesterov)", o.Momentum)
		}
		if o.LR == 0 {
			return bad("LR", "0 with kind sgd: give a learning rate")
		}
	case None:
		if o.LR != 0 || o.Momentum != 0 {
			return bad("LR", "lr %v, momentum %v with kind none: none averages the models and takes neither", o.LR, o.Momentum)
		}
		return o, nil
	default:
		return bad("Kind", "%v: want Nesterov, SGD or None", o.Kind)
	}
	if !(o.LR > 0 && o.LR <= math.MaxFloat32) {
		return bad("LR", "%v: want a finite learning rate > 0", o.LR)
	}
	return o, nil
}

// step applies the optimizer to global weights theta (and their momentum
// m, Nesterov's; nil otherwise) with the averaged pseudo-gradient avg.
func (o Optimizer) step(theta, m, avg []float32) {
	lr, mu := float32(o.LR), float32(o.Momentum)
	switch o.Kind {
	case Nesterov:
		for i, d := range avg {
			m[i] = float32(mu*m[i]) + d
			theta[i] -= float32(lr * (d + float32(mu*m[i])))
		}
	case SGD:
		for i, d := range avg {
			theta[i] -= float32(lr * d)
		}
	case None:
		for i, d := range avg {
			theta[i] -= d
		}
	}
}

// blend sets local ← α·local + (1−α)·global, each product rounded on its
// own; α = 0 copies global exactly.
func blend(local, global []float32, alpha float64) {
	if alpha == 0 {
		copy(local, global)
		return
	}
	a, b := float32(alpha), float32(1-alpha)
	for i, g := range global {
		local[i] = float32(a*local[i]) + float32(b*g)
	}
}
