package nccl

// FunctionTable returns the NCCL functions the package calls, from its own
// table (in its order), and whether Open requires each.
func FunctionTable() (names []string, required []bool) {
	for _, f := range functions {
		names = append(names, f.name)
		required = append(required, f.required)
	}
	return names, required
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
