// Program assaywatch-otelcol is an OpenTelemetry Collector distribution for assaywatch's
// tests and CI: the OTLP receiver, batch and memory_limiter processors, the kafka exporter
// and receiver, and the otlp, otlphttp, load-balancing, file and debug exporters, all from
// one Collector release. It is written by hand the way go.opentelemetry.io/collector/cmd/builder would
// generate it (main.go, main_others.go, components.go); build it with ./build.sh.
package main

import (
	"os"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	envprovider "go.opentelemetry.io/collector/confmap/provider/envprovider"
	fileprovider "go.opentelemetry.io/collector/confmap/provider/fileprovider"
	yamlprovider "go.opentelemetry.io/collector/confmap/provider/yamlprovider"
	"go.opentelemetry.io/collector/otelcol"
)

// version is the distribution's own version; the Collector release it is built from is
// in go.mod (go.opentelemetry.io/collector/otelcol).
const version = "0.161.0-assaywatch"

func main() {
	info := component.BuildInfo{
		Command:     "assaywatch-otelcol",
		Description: "OpenTelemetry Collector for assaywatch tests (otlp, kafka, load_balancing, file, debug)",
		Version:     version,
	}

	set := otelcol.CollectorSettings{
		BuildInfo: info,
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					envprovider.NewFactory(),
					fileprovider.NewFactory(),
					yamlprovider.NewFactory(),
				},
			},
		},
		ProviderModules: map[string]string{
			envprovider.NewFactory().Create(confmap.ProviderSettings{}).Scheme():  "go.opentelemetry.io/collector/confmap/provider/envprovider v1.67.0",
			fileprovider.NewFactory().Create(confmap.ProviderSettings{}).Scheme(): "go.opentelemetry.io/collector/confmap/provider/fileprovider v1.67.0",
			yamlprovider.NewFactory().Create(confmap.ProviderSettings{}).Scheme(): "go.opentelemetry.io/collector/confmap/provider/yamlprovider v1.67.0",
		},
	}

	if err := run(set); err != nil {
		// cobra has already printed the error.
		os.Exit(1)
	}
}

func runInteractive(params otelcol.CollectorSettings) error {
	return otelcol.NewCommand(params).Execute()
}
