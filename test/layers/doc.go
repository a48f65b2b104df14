// Package layers holds the test of the module's import graph: production
// packages import only layers below their own and never the lab (test
// peers, conformance suites, soak workload), so that the lab can change
// without touching what ships. It has no code of its own.
package layers
