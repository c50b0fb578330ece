# Shared by scripts/build-controlplane.sh and scripts/build-helm.sh: building pinned Go modules
# from the Go module proxy into a cache directory. Source it after defining `say MESSAGE` and
# `die MESSAGE` (each script prefixes its own name) and, before `lock_build_dir`, `cached`
# (true when the cache is complete and up to date).

# The pinned version of a module, read from the `require` line of a go.mod file.
pinned() {
    local modfile="$1" module="$2" version
    version="$(awk -v m="$module" '($1 == m || ($1 == "require" && $2 == m)) && !/=>/ {
        print ($1 == "require" ? $3 : $2); exit }' "$modfile")"
    [[ -n "$version" ]] || die "cannot find the pinned version of $module in $modfile"
    printf '%s' "$version"
}

# A Go toolchain that can build the module of go.mod file $1 ($2 names it in messages).
require_go() {
    local modfile="$1" what="$2" need have
    command -v go >/dev/null 2>&1 \
        || die "Go is not installed (no 'go' on PATH). Install Go >= 1.26 (https://go.dev/dl/) and rerun."
    need="$(awk '$1 == "go" { print $2; exit }' "$modfile")"
    have="$(go env GOVERSION)"
    have="${have#go}"
    if [[ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]]; then
        case "$(go env GOTOOLCHAIN)" in
            local*) die "Go $have is too old: $what needs Go >= $need and GOTOOLCHAIN=local \
forbids fetching a newer toolchain. Install Go >= $need or set GOTOOLCHAIN=auto." ;;
            *) say "Go $have < $need: the go command will fetch a newer toolchain through the proxy" ;;
        esac
    fi
    say "using $(go version) (GOPROXY=$(go env GOPROXY))"
}

# Take the build lock of cache directory $1 (concurrent `make test` runs build once) and make
# PARTIAL, a scratch directory inside it that is removed on exit. Exits 0 when another build
# finished meanwhile (`cached`). Starts the clock of `step`.
lock_build_dir() {
    mkdir -p "$1"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$1/.lock"
        flock 9
        if cached; then
            say "another build finished meanwhile; nothing to build"
            exit 0
        fi
    fi
    PARTIAL="$(mktemp -d "$1/.partial.XXXXXX")"
    trap 'rm -rf "$PARTIAL"' EXIT
    START=$SECONDS
}

step() { say "$1 (t+$((SECONDS - START))s)"; }

# `go mod download` in module directory $1 ($2 names it); the proxy's error and the fix if not.
go_download() {
    local dir="$1" what="$2" log
    log="$(mktemp)"
    if ! (cd "$dir" && go mod download) >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        die "cannot download the Go modules for $what from GOPROXY=$(go env GOPROXY). \
The Go module proxy must be reachable (or the modules already in $(go env GOMODCACHE))."
    fi
    rm -f "$log"
}
