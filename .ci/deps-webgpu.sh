#!/usr/bin/env bash
# System packages the WEBGPU backend needs in CI: Mesa's lavapipe (a software Vulkan driver) and the
# Vulkan loader; wgpu (pip extra [webgpu], part of [testing]) finds the adapter through them, headless.
set -euo pipefail
if ! ldconfig -p | grep -q libvulkan.so.1 || ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq mesa-vulkan-drivers libvulkan1
fi
