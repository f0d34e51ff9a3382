// Command gradcomp is gradcomp's command-line tool. Each job is a
// subcommand:
//
//	gradcomp bench [flags]    measure compressors on synthetic gradients
//	gradcomp train [flags]    data-parallel training demo comparing compression schemes
//	gradcomp netbench [flags] compressed exchanges against a dense MPI all-reduce (under mpirun)
//	gradcomp info [flags]     GPUs, their topology and the NCCL version (exits 0 without a GPU too)
//
// Run "gradcomp help" for the list and "gradcomp CMD -h" for a command's
// flags. Exit status: 0 on success, 1 when a command fails (including a bad
// flag value such as an unknown codec), 2 on a usage error (no or unknown
// command, unknown flag, stray argument).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	// run executes the command with its arguments and returns the exit status.
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands lists the subcommands in the order usage shows them.
var commands = []command{
	{"bench", "measure compressors on synthetic gradients (ratio, GB/s, error)", runBench},
	{"train", "train a small MLP data-parallel with each compression scheme (accuracy, bytes, time)", runTrain},
	{"netbench", "time compressed exchanges against a dense MPI all-reduce (-tags mpi, under mpirun)", runNetbench},
	{"info", "list GPUs, memory, compute capability, NVLink/PCIe topology and the NCCL version", runInfo},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches args[0] to its subcommand and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "gradcomp: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

// usage writes the list of subcommands to w.
func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: gradcomp COMMAND [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'gradcomp COMMAND -h' for a command's flags.")
}
