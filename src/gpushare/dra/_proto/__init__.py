"""Generated DRA and plugin-registration stubs (scripts/gen-proto.sh)."""
