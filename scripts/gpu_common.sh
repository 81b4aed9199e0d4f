# Shared by the scripts/gpu_*.sh checks: a binary is built here (release, with the CUDA link
# lines) and carried to the GPU machine, which has torch but no Rust (../shared/setup/NOTES.md,
# "GPU machines"). Sourced; each function takes the calling script's name for its messages.

# gpu_built NAME BIN: the release binary links libtorch_cuda (without it CUDA is invisible).
gpu_built() {
  readelf -d "$2" | grep -q torch_cuda || { echo "$1: $2 does not link libtorch_cuda" >&2; exit 1; }
  echo "built $2"
}

# gpu_runtime NAME BIN: the carried binary is here, and LD_LIBRARY_PATH points at this machine's
# torch and its nvidia/*/lib folders.
gpu_runtime() {
  [ -x "$2" ] || { echo "$1: $2 missing; run 'scripts/$1.sh build' on the CPU machine and carry it" >&2; exit 1; }
  local py=${PYTHON:-python3} torch_lib nv_libs
  torch_lib=$("$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  nv_libs=$("$py" -c 'import glob, os, torch; d = os.path.dirname(os.path.dirname(torch.__file__)); print(":".join(sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib")))))')
  export LD_LIBRARY_PATH="$torch_lib:$nv_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
