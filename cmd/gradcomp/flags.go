package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// parseFlags parses a subcommand's arguments, which must all be flags. It
// returns ok, or the exit status to end with: 0 for -h, 2 for a usage error
// (reported to stderr with the usage text).
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) (status int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		fs.Usage()
		return 2, false
	}
	return 0, true
}

// reportFailure writes err to stderr, one line per line of its message, each
// prefixed with prefix, and returns exit status 1.
func reportFailure(stderr io.Writer, prefix string, err error) int {
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintf(stderr, "%s: %s\n", prefix, line)
	}
	return 1
}
