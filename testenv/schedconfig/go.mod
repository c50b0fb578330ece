// Test tool only: decodes kube-scheduler configurations with the scheduler configuration API of
// one Kubernetes release (see main.go and scripts/build-schedconfig.sh). This go.mod names the
// module root only: each release's pins are in k8s-1.23.mod and k8s-1.24.mod (with their
// .sum files), chosen with `go build -modfile=k8s-1.23.mod` and so on.
module gpushare.test/schedconfig

go 1.22
