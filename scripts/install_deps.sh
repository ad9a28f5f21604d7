#!/usr/bin/env bash
# System packages the optional backends need, installed with apt-get when missing (Debian/Ubuntu).
#   CL: an OpenCL ICD loader and PoCL, the portable CPU OpenCL driver
#   WEBGPU: the Vulkan loader and Mesa's lavapipe (software Vulkan) that wgpu (pip extra [webgpu]) runs on
#   VIZ: Chromium, the browser test_viz_browser.py drives headless through Playwright (pip, testing extra) by its path
#   distributed: OpenMPI (mpirun and the library mpi4py, pip extra [distributed], builds against) for attograd.nn.distributed
#   CPU: clang beside gcc, so that the tests compile kernels with both C compilers (test_cpu_compilers.py): each has
#   its own gaps (Debian 12's clang 14 has no _Float16 on x86-64), and a user may have either
# Usage: scripts/install_deps.sh   (as root, or with sudo available). Safe to run again.
set -euo pipefail
packages=(ocl-icd-libopencl1 pocl-opencl-icd)
packages+=(libvulkan1 mesa-vulkan-drivers)  # WEBGPU
packages+=(clang)  # CPU: the second C compiler
packages+=(chromium)  # VIZ: the browser tests' browser (Playwright never downloads one here)
packages+=(openmpi-bin libopenmpi-dev)  # distributed: mpirun and the MPI library behind mpi4py
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "install_deps: no apt-get here; install these packages (or your system's equivalents) yourself: ${missing[*]}" >&2
  exit 1
fi
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
