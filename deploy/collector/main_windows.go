//go:build windows

package main

import "go.opentelemetry.io/collector/otelcol"

// The Windows service wrapper of the generated distributions is left out: this binary is
// for tests and CI on Linux.
func run(params otelcol.CollectorSettings) error {
	return runInteractive(params)
}
