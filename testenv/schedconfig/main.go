// Command schedconfig decodes a kube-scheduler configuration file the way one Kubernetes
// release's kube-scheduler does, strictly: with that release's kubescheduler.config.k8s.io
// types (k8s.io/kube-scheduler/config/v1beta2 and v1beta3, at the version the go.mod file it
// was built with pins) and a strict codec, so that an unknown, misspelled or wrongly-cased
// field, a duplicate field or a wrong type is an error, in the file itself and in the arguments
// of the plugins the release knows (pluginConfig[].args, e.g. DefaultPreemptionArgs).
//
// kube-scheduler builds its codec the same way (k8s.io/kubernetes
// pkg/scheduler/apis/config/scheme: serializer.NewCodecFactory(scheme, serializer.EnableStrict))
// and decodes plugin arguments with the types' own DecodeNestedObjects. What kube-scheduler
// does after decoding (defaulting, conversion, validation) lives in k8s.io/kubernetes and is
// not repeated here.
//
// Usage:
//
//	schedconfig FILE     print the decoded configuration as JSON on stdout (exit 0), or say
//	                     why the file is refused on stderr (exit 1)
//	schedconfig --release  print the k8s.io/kube-scheduler version it was built with
//
// Output: {"kubeScheduler": "v0.23.17", "apiVersion": "...", "kind": "...", "config": {...}},
// "config" being the typed configuration encoded again (fields at their zero value left out,
// plugin arguments as their typed structs). Exit status 2 for a usage error.
//
// Built by scripts/build-schedconfig.sh once per pinned release (k8s-1.23.mod, k8s-1.24.mod);
// tests/test_deploy_manifests.py runs it on deploy/scheduler/kube-scheduler-config-v1beta*.yaml.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/kube-scheduler/config/v1beta2"
	"k8s.io/kube-scheduler/config/v1beta3"
)

const kubeSchedulerModule = "k8s.io/kube-scheduler"

// nestedCodec is what the scheduler's configuration types decode plugin arguments with and
// encode them again with.
type nestedCodec interface {
	runtime.Object
	DecodeNestedObjects(d runtime.Decoder) error
	EncodeNestedObjects(e runtime.Encoder) error
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	release := moduleVersion()
	if len(args) == 1 && args[0] == "--release" {
		fmt.Println(release)
		return 0
	}
	if len(args) != 1 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(os.Stderr, "usage: schedconfig FILE | schedconfig --release")
		return 2
	}
	out, err := decodeFile(args[0], release)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(string(out))
	return 0
}

func decodeFile(path, release string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1beta2.AddToScheme, v1beta3.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, fmt.Errorf("registering the scheduler configuration types: %w", err)
		}
	}
	codecs := serializer.NewCodecFactory(scheme, serializer.EnableStrict)
	decoder := codecs.UniversalDeserializer()
	where := fmt.Sprintf("%s (kube-scheduler configuration API of %s %s)", path, kubeSchedulerModule, release)
	accepted := "accepted: kind KubeSchedulerConfiguration of " + v1beta2.SchemeGroupVersion.String() +
		" or " + v1beta3.SchemeGroupVersion.String()

	obj, gvk, err := decoder.Decode(data, nil, nil)
	if runtime.IsNotRegisteredError(err) || runtime.IsMissingKind(err) || runtime.IsMissingVersion(err) {
		return nil, fmt.Errorf("%s: %w (%s)", where, err, accepted)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	config, ok := obj.(nestedCodec)
	if !ok || gvk.Kind != "KubeSchedulerConfiguration" {
		return nil, fmt.Errorf("%s: kind %s of %s is not a scheduler configuration (%s)",
			where, gvk.Kind, gvk.GroupVersion(), accepted)
	}
	if err := config.DecodeNestedObjects(decoder); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	// Plugin arguments back into JSON from their typed structs (the raw bytes were the file's).
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		return nil, fmt.Errorf("%s: no JSON serializer for encoding plugin arguments", where)
	}
	if err := config.EncodeNestedObjects(info.Serializer); err != nil {
		return nil, fmt.Errorf("%s: encoding plugin arguments: %w", where, err)
	}
	return json.MarshalIndent(map[string]any{
		"kubeScheduler": release,
		"apiVersion":    gvk.GroupVersion().String(),
		"kind":          gvk.Kind,
		"config":        config,
	}, "", "  ")
}

// moduleVersion is the k8s.io/kube-scheduler version this binary was built with.
func moduleVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == kubeSchedulerModule {
				if dep.Replace != nil {
					return dep.Replace.Version
				}
				return dep.Version
			}
		}
	}
	return "unknown"
}
