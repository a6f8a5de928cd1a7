"""The GPU catalogue: what gpuserve knows about each accelerator model, and a host's hardware profile.

A ``HardwareProfile`` is either *declared* (inventory / group data: ``gpu_model``, ``gpu_count``,
``nvswitch``, ``gpu_memory_gib``) or *observed* (facts: ``nvidia-smi`` / ``amd-smi``, each GPU a
``GpuInfo``, see ``gpuserve.facts.gpus``). Plan-time validation works from the declared one;
the GPU-stack layer compares the two (``gpuserve.stack.check_gpus``).

``PROFILES`` is the one table of each recipe profile's machines (see below).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    name: str
    vendor: str  # nvidia | amd | cpu
    arch: str  # hopper | blackwell | cdna4 | cpu
    # Can the pinned vLLM keep MiniMax M3's KV cache in NVFP4 here? Only on Blackwell: vLLM 0.33.0
    # (vllm/models/minimax_m3/common/sparse_attention.py) serves an NVFP4 KV cache "only with the
    # SM100 MSA backend". vLLM's own recipe file shows NVFP4 on MI355X, but for a nightly image:
    # 0.33.0 refuses it there (see docs/recipes.md). Hopper has no FP4 units at all.
    nvfp4_kv_cache: bool
    # NVLink generation of the model's NVSwitch systems: 5 (NVLink 5) also needs nvlsm
    nvlink_gen: int = 0


GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("H100", "nvidia", "hopper", nvfp4_kv_cache=False, nvlink_gen=4),
        GpuModel("H200", "nvidia", "hopper", nvfp4_kv_cache=False, nvlink_gen=4),
        GpuModel("B200", "nvidia", "blackwell", nvfp4_kv_cache=True, nvlink_gen=5),
        GpuModel("GB200", "nvidia", "blackwell", nvfp4_kv_cache=True, nvlink_gen=5),
        GpuModel("MI355X", "amd", "cdna4", nvfp4_kv_cache=False),
        GpuModel("MI350X", "amd", "cdna4", nvfp4_kv_cache=False),
        GpuModel("cpu", "cpu", "cpu", nvfp4_kv_cache=False),
    )
}


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as its vendor tool lists it (parsed by gpuserve.facts.gpus, for ``gpuserve status``
    and the GPU-stack verification alike)."""

    index: int
    vendor: str  # nvidia | amd
    name: str  # as the tool reports it: "NVIDIA H100 80GB HBM3", "AMD Instinct MI355X"
    model: str  # normalized: H100, MI355X, ... (the report's name when unknown)
    memory_mib: int | None = None
    driver_version: str | None = None
    bus_id: str | None = None
    uuid: str | None = None
    gfx: str | None = None  # AMD TARGET_GRAPHICS_VERSION


@dataclass(frozen=True)
class HardwareProfile:
    gpu_model: str  # a key of GPU_MODELS, or an unknown name as reported
    gpu_count: int
    nvswitch: bool | None = None  # None: not known (nvidia-smi does not say)
    gpu_memory_gib: float | None = None  # per GPU
    driver_version: str | None = None

    @property
    def known(self) -> GpuModel | None:
        return GPU_MODELS.get(self.gpu_model)

    @property
    def vendor(self) -> str | None:
        return self.known.vendor if self.known else None

    @property
    def arch(self) -> str | None:
        return self.known.arch if self.known else None

    def describe(self) -> str:
        if self.gpu_model == "cpu":
            return "CPU only (no GPUs)"
        parts = [f"{self.gpu_count}x {self.gpu_model}"]
        if self.gpu_memory_gib:
            parts.append(f"{self.gpu_memory_gib:g} GiB each")
        if self.nvswitch is not None:
            parts.append("NVSwitch" if self.nvswitch else "no NVSwitch")
        if self.driver_version:
            parts.append(f"driver {self.driver_version}")
        return ", ".join(parts)


# --- the recipe profiles' hardware ----------------------------------------------------------------
# The one table of it: recipes.RECIPES and RECIPE_FOR_HARDWARE, plan.PROFILE_HARDWARE (a bare
# ``gpuserve plan --profile``), the sandbox's simulated machines (gpuserve_sandbox.simgpu) and the
# unit tests' inventories are derived from it; group_data/<profile>.py declares the same three
# values as plain data for operators to copy (tests/unit/test_hardware_profiles.py ties them).


@dataclass(frozen=True)
class ProfileHardware:
    """The machines one recipe profile is written for."""

    gpu_model: str  # the reference machine's model: the recipe's, the sandbox's, a bare plan's
    gpu_count: int
    nvswitch: bool
    gpu_models: tuple[str, ...]  # every model that gets this profile (with gpu_count GPUs)

    def group_data(self) -> dict[str, object]:
        """The reference machine as group data declares it (group_data/<profile>.py)."""
        return {"gpu_model": self.gpu_model, "gpu_count": self.gpu_count, "nvswitch": self.nvswitch}


PROFILES: dict[str, ProfileHardware] = {
    # HGX H200 (or H100): 8 GPUs on NVSwitch
    "hopper_x8": ProfileHardware("H200", 8, True, gpu_models=("H100", "H200")),
    # GB200 (or B200): 4 GPUs on an NVLink 5 switch fabric
    "blackwell_x4": ProfileHardware("GB200", 4, True, gpu_models=("B200", "GB200")),
    # AMD Instinct MI355X (or MI350X): 4 GPUs on Infinity Fabric (XGMI), no NVSwitch
    "mi355x_x4": ProfileHardware("MI355X", 4, False, gpu_models=("MI355X", "MI350X")),
    "cpu": ProfileHardware("cpu", 0, False, gpu_models=("cpu",)),
}
