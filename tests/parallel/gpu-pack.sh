#!/usr/bin/env bash
# Packs what tests/parallel/gpu-check.sh needs on the lent GPU machine, which has CUDA and NCCL (the nvidia-nccl
# wheel) but no MPI: a portable sm_90a CUDA+NCCL build of tessera and logits_diff, the shared libraries they need
# beyond CUDA's, and this host's Open MPI runtime (mpirun, its components, PMIx) trimmed of the network transports
# a single host does not use. Everything goes to .parpack/parbin.tar.xz (ignored by git); carry `.parpack`.
#   bash tests/parallel/gpu-pack.sh            # TSR_GPUPACK_BUILD=build folder (default build-gpu-par)
# TSR_GPUPACK_SLIM=1 packs for single-GPU calls only (scripts/device-gemv.sh, device-matrix.sh): no Open MPI, no
# logits_diff, none of the libraries only Open MPI's components load (about 5 MB instead of 6.7, leaving room in a
# device call's 64 MiB for other builds to A/B against). TSR_GPUPACK_ALT="NAME=FILE ..." packs each tessera FILE
# (another build, stripped here) as .parbin/alt/tessera-NAME, the BIN=NAME variants of scripts/device-*.sh; the
# archive is compressed with xz -9, whose 64 MiB window finds the builds' common code (another build adds about
# 0.15 MB instead of 1.8 MB as a file of its own); TSR_GPUPACK_ALT_TESTS="NAME=FILE ..." does the same for
# another build's test_cuda (.parbin/alt/test_cuda-NAME: BIN=NAME in scripts/device-kvq.sh's test variants).
# TSR_GPUPACK_ARCHS (default 90a-real: sm_90a code without its PTX, which the lent H100/H200 never JIT-compiles; 2 MB
# less in the pack, which with the new tile kernels no longer fitted beside the tracked files) builds for other
# architectures: 80 makes the H200 JIT-compile sm_80 code, which runs the kernels and paths of consumer cards (no
# bulk copies, no programmatic launch: backend.cu tsr_cuda_sm90).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=${TSR_GPUPACK_BUILD:-$root/build-gpu-par}
cmake -S "$root" -B "$build" -DTSR_NATIVE=OFF -DTSR_CUDA=ON -DTSR_CUDA_ARCHS="${TSR_GPUPACK_ARCHS:-90a-real}" \
  -DTSR_NCCL=ON > "$build.configure.log"
grep -q "NCCL for GPU workers" "$build.configure.log" || { echo "gpu-pack: this build found no NCCL" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" --target tessera logits_diff test_cuda test_peer_ipc > "$build.log"
out=$root/.parbin
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/ompi"
cp "$build/tessera" "$build/tests/parallel/logits_diff" "$build/tests/gpu/test_cuda" "$build/tests/gpu/test_peer_ipc" \
  "$out/bin/"
strip "$out/bin/tessera" "$out/bin/logits_diff" "$out/bin/test_cuda" "$out/bin/test_peer_ipc"

# Open MPI as Debian installs it, under a prefix that OPAL_PREFIX relocates
ompi=/usr/lib/x86_64-linux-gnu/openmpi
mkdir -p "$out/ompi/bin" "$out/ompi/lib/x86_64-linux-gnu" "$out/ompi/share" "$out/ompi/etc"
cp -L /usr/bin/orterun "$out/ompi/bin/mpirun"
cp -L /usr/bin/orted "$out/ompi/bin/orted"
cp -a "$ompi" "$out/ompi/lib/x86_64-linux-gnu/"
rm -rf "$out/ompi/lib/x86_64-linux-gnu/openmpi/include" "$out/ompi/lib/x86_64-linux-gnu/openmpi/lib/pkgconfig"
comp=$out/ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
# transports and tools a single host (or a TCP cluster) does not need; their libraries stay behind
rm -f "$comp"/*ucx* "$comp"/*ofi* "$comp"/*psm* "$comp"/*openib* "$comp"/*io_romio* "$comp"/*fcoll* \
      "$comp"/*sharedfp* "$comp"/*fbtl* "$comp"/*fs_ufs* "$comp"/*io_ompio* "$comp"/*monitoring* "$comp"/*treematch*
rm -f "$out"/ompi/lib/x86_64-linux-gnu/openmpi/lib/*java* "$out"/ompi/lib/x86_64-linux-gnu/openmpi/lib/*ucx* \
      "$out"/ompi/lib/x86_64-linux-gnu/openmpi/lib/*ofi* "$out"/ompi/lib/x86_64-linux-gnu/openmpi/lib/*verbs* \
      "$out"/ompi/lib/x86_64-linux-gnu/openmpi/lib/*mpifh* "$out"/ompi/lib/x86_64-linux-gnu/openmpi/lib/*usempi* \
      "$out"/ompi/lib/x86_64-linux-gnu/openmpi/lib/*monitoring* "$out"/ompi/lib/x86_64-linux-gnu/openmpi/lib/*ompio*
cp -a /usr/share/openmpi "$out/ompi/share/"
rm -rf "$out/ompi/share/openmpi/"*.txt.bak "$out/ompi/share/openmpi/amca-param-sets" 2>/dev/null || true
if [ -d /usr/lib/x86_64-linux-gnu/pmix2 ]; then
  mkdir -p "$out/ompi/pmix2"
  cp -a /usr/lib/x86_64-linux-gnu/pmix2/. "$out/ompi/pmix2/"
  rm -rf "$out/ompi/pmix2/include" "$out/ompi/pmix2/lib/pkgconfig"
fi

# shared libraries: everything the binaries and components load except the C runtime, CUDA and NCCL (there already)
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libgcc_s|libstdc\+\+|libcuda\.so'
skip+='|libcudart|libcublas|libnccl|libnvidia|libresolv|libutil)'
objs=("$out/bin/tessera" "$out/bin/logits_diff" "$out/bin/test_cuda" "$out/bin/test_peer_ipc" /usr/bin/orterun
      /usr/bin/orted)
while IFS= read -r f; do objs+=("$f"); done < <(find "$comp" "$out/ompi/pmix2" -name '*.so' 2>/dev/null)
for o in "${objs[@]}"; do
  ldd "$o" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
  done
done
# hwloc's PCI plugin (GPUs are found by bus id through it; HWLOC_PLUGINS_PATH points there)
mkdir -p "$out/hwloc"
if [ -f /usr/lib/x86_64-linux-gnu/hwloc/hwloc_pci.so ]; then
  cp -L /usr/lib/x86_64-linux-gnu/hwloc/hwloc_pci.so "$out/hwloc/"
  ldd "$out/hwloc/hwloc_pci.so" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
  done
fi
for alt in ${TSR_GPUPACK_ALT:-}; do
  mkdir -p "$out/alt" && strip -o "$out/alt/tessera-${alt%%=*}" "${alt#*=}"
done
for alt in ${TSR_GPUPACK_ALT_TESTS:-}; do
  mkdir -p "$out/alt" && strip -o "$out/alt/test_cuda-${alt%%=*}" "${alt#*=}"
done
du -sh "$out"
exclude=$(git rev-parse --git-path info/exclude) # a worktree's .git is a file
mkdir -p "$(dirname "$exclude")"
grep -qx '/.parbin/' "$exclude" 2>/dev/null || echo '/.parbin/' >> "$exclude"
grep -qx '/.parpack/' "$exclude" 2>/dev/null || echo '/.parpack/' >> "$exclude"
rm -rf .parpack && mkdir -p .parpack
if [ "${TSR_GPUPACK_SLIM:-0}" = 1 ]; then
  slim=(--exclude=.parbin/ompi --exclude=.parbin/bin/logits_diff --exclude=.parbin/bin/test_peer_ipc)
  for f in liboshmem.so.40 libpmix.so.2 libmunge.so.2 libnl-3.so.200 libpciaccess.so.0 libmca_common_sm.so.40; do
    slim+=("--exclude=.parbin/lib/$f")
  done
fi
# xz -9: its 64 MiB window finds the code that tessera, test_cuda and any other build have in common
tar -cf - ${slim[@]+"${slim[@]}"} .parbin | xz -9 -T0 > .parpack/parbin.tar.xz
du -sh .parpack
