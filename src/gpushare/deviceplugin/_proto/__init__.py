"""Generated device plugin v1beta1 stubs (scripts/gen-proto.sh); do not edit by hand."""
