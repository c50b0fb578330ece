"""Generated dra/v1/api.proto stubs (scripts/gen-proto.sh); do not edit by hand."""
