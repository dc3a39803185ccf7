#!/usr/bin/env bash
# The ignored folders that device calls carry (what the GPU image lacks), made here from the package index, from the
# repository root. A session starts from a bare checkout, so each one makes the folders it needs:
#
#   bash bench/carry_make.sh peers      # .carry_peers: FlashInfer's files trimmed to its comm kernels (fi.tar.xz),
#                                       # apache-tvm-ffi's and platformdirs' wheels (~14 MB; bench/NOTES.md, "Peers")
#   bash bench/carry_make.sh ort        # .carry_ort: ortools and immutabledict, unpacked and xz'd, with platformdirs
#   bash bench/carry_make.sh solvers    # .carry_solvers: the same with z3-solver
#   bash bench/carry_make.sh base REV   # .carry_base: REV's code (base.tgz, bench/variants_ab.sh) and platformdirs
#
# FlashInfer's comm kernels are not made here: a call without .carry_peers/aot/*.so.gz JIT-builds them (about two
# minutes on the device), and `bench/peers_run.sh N probe` returns them for .carry_peers/aot/.
# The folders are ignored through .git/info/exclude, which this script extends.
set -eu
WHL=${WHL:-/tmp/carry-wheels}
PLAT=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
fetch() { python3 -m pip download -q --no-deps --only-binary=:all: "${PLAT[@]}" -d "$WHL" "$@"; }
case ${1:-} in
  peers | ort | solvers) ;;
  base) [ -n "${2:-}" ] || { echo "carry_make.sh: base REV: the commit to A/B against" >&2; exit 2; } ;;
  *) echo "carry_make.sh: unknown folder '${1:-}' (peers, ort, solvers, base REV)" >&2; exit 2 ;;
esac
grep -qx '/.carry_\*/' .git/info/exclude 2>/dev/null || echo '/.carry_*/' >>.git/info/exclude
mkdir -p "$WHL"
fetch platformdirs
unpacked() {  # folder, wheels: the wheels' files in one tar.xz
  local site
  site=$(mktemp -d)
  for w in "${@:2}"; do python3 -m zipfile -e "$w" "$site"; done
  tar -cf - -C "$site" . | xz -6 -T0 >"$1/solvers.tar.xz"
  rm -rf "$site"
}
case $1 in
  peers)
    fetch flashinfer-python==0.7.2.post1 'apache-tvm-ffi>=0.1.11,<0.2'
    mkdir -p .carry_peers
    site=$(mktemp -d)
    python3 -m zipfile -e "$WHL"/flashinfer_python-0.7.2.post1-*.whl "$site"
    d=$site/flashinfer/data
    mv "$d/cccl/libcudacxx/include" "$site/cccl-include" && rm -rf "$d/cccl" "$d/cutlass"
    mkdir -p "$d/cccl/libcudacxx" && mv "$site/cccl-include" "$d/cccl/libcudacxx/include"
    # csrc: the comm kernels' sources and the top-level headers and templates they include
    find "$d/csrc" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
    find "$d/csrc" -maxdepth 1 -type f -name '*.cu' ! -name trtllm_allreduce.cu ! -name trtllm_allreduce_fusion.cu \
      ! -name trtllm_moe_allreduce_fusion.cu ! -name vllm_custom_all_reduce.cu -delete
    tar -cf - -C "$site" . | xz -6 -T0 >.carry_peers/fi.tar.xz
    rm -rf "$site"
    cp "$WHL"/apache_tvm_ffi-*.whl "$WHL"/platformdirs-*.whl .carry_peers/ ;;
  ort | solvers)
    fetch ortools immutabledict
    [ "$1" = solvers ] && fetch z3-solver
    out=.carry_$1
    mkdir -p "$out"
    wheels=("$WHL"/ortools-*.whl "$WHL"/immutabledict-*.whl)
    [ "$1" = solvers ] && wheels+=("$WHL"/z3_solver-*.whl)
    unpacked "$out" "${wheels[@]}"
    cp "$WHL"/platformdirs-*.whl "$out/" ;;
  base)
    mkdir -p .carry_base
    # the code alone: variants_ab.sh reads the registry from this tree, and the results, registries, tests and docs
    # would push the call past its 64 MiB beside .carry_peers (the eighteenth session: 9.6 MB whole, 0.7 MB so)
    git archive --format=tar.gz "$2" -o .carry_base/base.tgz -- . ':(exclude)bench/results' \
      ':(exclude)bench/registry_*' ':(exclude)tests' ':(exclude)docs'
    cp "$WHL"/platformdirs-*.whl .carry_base/ ;;
esac
du -sh .carry_* | sed 's/^/carry_make.sh: /'
