package nccl

// FunctionTable returns the NCCL functions the package calls, from its own
// table (in its order), whether Open requires each, and for an optional
// one the NCCL version that added it (zero for a required one).
func FunctionTable() (names []string, required []bool, since []Version) {
	for f := range fnCount {
		names = append(names, functions[f].name)
		required = append(required, f.required())
		var v Version
		if c := functions[f].since; c != 0 {
			v = VersionFromCode(c)
		}
		since = append(since, v)
	}
	return names, required, since
}

// SymbolFile returns the file that holds the library's resolved function
// name, "" when it is unresolved, unknown to the package, or dladdr cannot
// tell.
func (l *Library) SymbolFile(name string) string {
	for f := range fnCount {
		if functions[f].name == name && l.fns[f] != 0 {
			return dlpath(l.fns[f])
		}
	}
	return ""
}
