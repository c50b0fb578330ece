// Test tool only: decodes kube-scheduler configurations with the scheduler configuration API of
// one Kubernetes release (see main.go and scripts/build-schedconfig.sh). This go.mod names the
// module root only: each release's pins are in k8s-1.23.mod and k8s-1.24.mod (with their
// .sum files), chosen with `go build -modfile=k8s-1.23.mod` and so on.
module gpushare.test/schedconfig

go 1.22

require (
	k8s.io/apimachinery v0.24.17
	k8s.io/kube-scheduler v0.24.17
)

require (
	github.com/go-logr/logr v1.2.0 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/google/gofuzz v1.1.0 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/spf13/pflag v1.0.5 // indirect
	golang.org/x/net v0.8.0 // indirect
	golang.org/x/text v0.8.0 // indirect
	gopkg.in/inf.v0 v0.9.1 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
	k8s.io/api v0.24.17 // indirect
	k8s.io/component-base v0.24.17 // indirect
	k8s.io/klog/v2 v2.60.1 // indirect
	k8s.io/utils v0.0.0-20220210201930-3a6ce19ff2f9 // indirect
	sigs.k8s.io/json v0.0.0-20211208200746-9f7c6b3444d2 // indirect
	sigs.k8s.io/structured-merge-diff/v4 v4.2.3 // indirect
	sigs.k8s.io/yaml v1.2.0 // indirect
)
