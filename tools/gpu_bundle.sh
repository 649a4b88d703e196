#!/usr/bin/env bash
# Builds, here, everything tools/gpu_check.sh runs, and packs it for the lent GPU machine, which
# has CUDA's driver and toolkit, PyTorch's NCCL and cuBLAS wheels, and nothing else Loom needs: no
# Bazel, no Debian packages (Gloo, oneDNN, fmt, ...) and no network to fetch them. The bundle is
# one .tar.xz of
#   bin/  the GPU test binaries, cuda_gemm_bench and loom_train at their bazel-bin paths, with
#         bazel-bin/_solib_k8 (Loom's own shared libraries, which the binaries find through
#         their RUNPATH $ORIGIN/../../_solib_k8);
#   lib/  every shared library they load that the GPU machine does not provide (Gloo and its
#         dependencies, oneDNN, fmt, libgomp, this build's libcudart);
# checked before packing: with LD_LIBRARY_PATH=lib/, every binary and library resolves each
# dependency inside the bundle or to a library the GPU machine has (glibc, libstdc++, libgcc_s,
# the driver's libcuda, NCCL and cuBLASLt, which gpu_check.sh finds there).
#
# Usage: tools/gpu_bundle.sh [DIR]   (default .gpu_bundle; git ignores it)
# Then, through the device tool: command "tools/gpu_check.sh --prebuilt .gpu_bundle", carry
# [".gpu_bundle"].
set -euo pipefail

cd "$(dirname "$0")/.."
out="${1:-.gpu_bundle}"

# What gpu_check.sh runs (tools/gpu_binaries.txt: "test|program <bazel-bin path>").
mapfile -t binaries < <(awk '$1 == "test" || $1 == "program" { print $2 }' tools/gpu_binaries.txt)

./loom setup
targets=()
for b in "${binaries[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
bazel build -c opt "${targets[@]}"

stage=$(mktemp -d)
trap 'rm -rf "${stage}"' EXIT
mkdir -p "${stage}/bin/_solib_k8" "${stage}/lib"
for b in "${binaries[@]}"; do
  mkdir -p "${stage}/bin/${b%/*}"
  cp -L "bazel-bin/${b}" "${stage}/bin/${b}"
done
cp -L bazel-bin/_solib_k8/*.so "${stage}/bin/_solib_k8/"

# Libraries the GPU machine provides (its glibc and libstdc++ are newer than this Debian's, and
# backward compatible); everything else a binary loads travels in lib/.
provided='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libnccl\.so|libcublasLt\.so|libcublas\.so)'
objects=("${stage}"/bin/_solib_k8/*.so)
for b in "${binaries[@]}"; do objects+=("${stage}/bin/${b}"); done
for object in "${objects[@]}"; do
  ldd "${object}" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
    [[ "${name}" =~ ${provided} ]] && continue
    [[ "${path}" == "${stage}"/* ]] && continue
    [[ -e "${stage}/lib/${name}" ]] || cp -L "${path}" "${stage}/lib/${name}"
  done
done

# The check: nothing resolves outside the bundle but what the GPU machine provides, and nothing
# is missing.
bad=0
for object in "${objects[@]}" "${stage}"/lib/*; do
  while read -r line; do
    name=$(awk '{ print $1 }' <<<"${line}")
    [[ "${name}" =~ ${provided} ]] && continue
    if [[ "${line}" == *"not found"* || "${line}" != *"${stage}"* ]]; then
      echo "gpu_bundle: ${object#"${stage}"/} loads ${line}, which the GPU machine lacks" >&2
      bad=1
    fi
  done < <(LD_LIBRARY_PATH="${stage}/lib" ldd "${object}" | grep "=>")
done
[[ "${bad}" == 0 ]] || exit 1

mkdir -p "${out}"
git rev-parse HEAD >"${stage}/commit"
tar -C "${stage}" -cJf "${out}/loom-gpu.tar.xz" .
echo "gpu_bundle: ${out}/loom-gpu.tar.xz, $(du -h "${out}/loom-gpu.tar.xz" | cut -f1) (commit $(cut -c1-12 "${stage}/commit"))" \
  "with ${#binaries[@]} binaries and $(ls "${stage}/lib" | wc -l) libraries: $(ls "${stage}/lib" | tr '\n' ' ')"
