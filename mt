#!/usr/bin/env bash
# mergetrace's front door. Installs what is missing (scripts/setup), builds, runs.
#   ./mt setup                 install what building needs (scripts/setup)
#   ./mt run [ARGS...]         build (release) and run mergetrace ARGS, as root (sudo if needed)
#   ./mt test [ARGS...]        install test tools too (and build the release once, for its
#                              image), then `cargo xtask test ARGS` (as root)
#   ./mt dist                  install the packaging tools too, then `cargo xtask dist`
#   ./mt CMD [ARGS...]         anything else: `cargo xtask CMD ARGS`
set -euo pipefail

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
export PATH="$HOME/.cargo/bin:$PATH"

usage() {
    sed -n '2,8s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

in_root() { (cd "$root" && "$@"); }

cmd=${1:-}
case "$cmd" in
    "" | -h | --help | help)
        usage
        ;;
    setup)
        shift
        exec "$root/scripts/setup" "$@"
        ;;
    run)
        shift
        "$root/scripts/setup"
        in_root cargo build --release -p mergetrace
        bin="${CARGO_TARGET_DIR:-$root/target}/release/mergetrace"
        # Run from the caller's directory, so relative paths in ARGS mean what they say.
        if [ "$(id -u)" -eq 0 ]; then
            exec "$bin" "$@"
        fi
        command -v sudo >/dev/null || { echo "mt: mergetrace needs root and there is no sudo" >&2; exit 1; }
        exec sudo "$bin" "$@"
        ;;
    test)
        shift
        "$root/scripts/setup" --test
        # The image test (kernel_image) runs what `./mt dist` built: built first when missing.
        if ! compgen -G "${CARGO_TARGET_DIR:-$root/target}/dist/mergetrace-*-oci.tar" >/dev/null; then
            "$root/scripts/setup" --dist
            in_root cargo xtask dist
        fi
        in_root cargo xtask test "$@"
        ;;
    dist)
        shift
        "$root/scripts/setup" --dist
        in_root cargo xtask dist "$@"
        ;;
    *)
        "$root/scripts/setup"
        in_root cargo xtask "$@"
        ;;
esac
