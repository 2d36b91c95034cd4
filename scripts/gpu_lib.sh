# Sourced by the GPU scripts (scripts/gpu_profile.sh, scripts/gpu_sim_vs_real.sh): gpu_setup NAME DEFAULT_OUT makes
# $OUT and a work folder $work (…/NAME) and sets $py; pack writes $work into $OUT/NAME.tgz, atomically, so a run cut
# short keeps what it finished.
gpu_setup() {
    cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
    OUT="${OUT:-$2}"
    work="$(mktemp -d)/$1"
    mkdir -p "$OUT" "$work"
    export PYTHONUNBUFFERED=1
    py="${PYTHON:-python3}"
}
pack() {
    local name
    name="$(basename "$work")"
    tar -czf "$OUT/$name.tgz.tmp" -C "$(dirname "$work")" "$name" && mv "$OUT/$name.tgz.tmp" "$OUT/$name.tgz"
}
